"""Prometheus metrics: the server's cached status as metric families, plus the gateway's own
HTTP requests and latency, all in a registry of the gateway's own."""
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .stats import padding_efficiency
from .status_view import by_worker_name

HISTOGRAMS = {  # the server's histogram -> help text
    "queue_seconds": "Seconds a job waited from admission to the start of its forward pass",
    "inference_seconds": "Seconds per forward pass",
    "request_seconds": "Server-side seconds per request, end to end",
    "batch_rows": "Rows per forward pass",
    "batch_padded_tokens": "Padded tokens per forward pass",
}
HTTP_BUCKETS = (.002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    def __init__(self, link):
        self.registry = CollectorRegistry()
        self.registry.register(ServerStatusCollector(link))
        self.requests = Counter("encoder_gateway_http_requests", "HTTP requests the gateway answered",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("encoder_gateway_http_request_duration_seconds",
                                 "HTTP request latency measured in the gateway, end to end", ["route"],
                                 buckets=HTTP_BUCKETS, registry=self.registry)

    def observe(self, route, method, status, seconds):
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def exposition(self):
        return generate_latest(self.registry)


class ServerStatusCollector:
    """Translates the latest status sample into metric families at each scrape."""

    def __init__(self, link):
        self.link = link

    def collect(self):
        status = self.link.status
        yield _gauge("encoder_up", "1 when the encoder-server answered the last status poll", status is not None)
        if status is None:
            return
        yield _gauge("encoder_ready", "1 when every worker is up and the server is not draining", status["ready"])
        yield from _counters(status)
        yield from _gauges(status)
        yield from _per_model(status)
        for name, hist in status["metrics"]["histograms"].items():
            yield _histogram(f"encoder_{name}", HISTOGRAMS.get(name, name), hist)


def _counters(status):
    for name, key, help_text in (("encoder_requests", "requests", "Requests by outcome"),
                                 ("encoder_texts", "texts", "Texts by outcome")):
        family = CounterMetricFamily(name, help_text, labels=["outcome"])
        for outcome, value in status[key].items():
            family.add_metric([outcome], value)
        yield family
    yield CounterMetricFamily("encoder_worker_restarts", "Workers restarted", value=status["worker_restarts"])
    yield CounterMetricFamily("encoder_jobs_redispatched", "Jobs sent again after their worker died",
                              value=status["jobs_redispatched"])
    yield CounterMetricFamily("encoder_busy_rejections", "Requests refused because the server was full",
                              value=status["requests"]["busy"])
    tokens = CounterMetricFamily("encoder_tokens", "Tokens computed: real, and with padding", labels=["kind"])
    for kind, value in status["metrics"]["tokens"].items():
        tokens.add_metric([kind], value)
    yield tokens
    yield CounterMetricFamily("encoder_forward_passes", "Forward passes run", value=status["metrics"]["passes"])
    yield CounterMetricFamily("encoder_texts_truncated", "Texts cut at max_seq_len", value=status["metrics"]["truncated"])


def _gauges(status):
    queues = status["queue_depth"]
    depth = GaugeMetricFamily("encoder_queue_depth", "Jobs queued in the ventilator", labels=["queue"])
    for queue in ("priority", "bulk"):
        depth.add_metric([queue], queues[queue])
    yield depth
    yield _gauge("encoder_pending_texts", "Texts admitted and not yet encoded", queues["pending_texts"])
    yield _gauge("encoder_max_pending_texts", "The admission limit on pending texts", queues["max_pending_texts"])
    yield _gauge("encoder_in_flight_requests", "Requests admitted and not yet answered", status["in_flight_requests"])
    yield _gauge("encoder_workers_alive", "Workers heartbeating", status["workers_alive"])
    yield _gauge("encoder_workers_expected", "Workers configured", status["workers_expected"])
    yield _gauge("encoder_workers_busy", "Workers holding at least one job", status["workers_busy"])
    per_worker = GaugeMetricFamily("encoder_worker_busy_texts", "Texts held by each worker", labels=["worker"])
    for worker, texts in by_worker_name(status["worker_busy_texts"]).items():  # no pid: open route, stable series
        per_worker.add_metric([worker], texts)
    yield per_worker
    efficiency = padding_efficiency(status)
    if efficiency is not None:
        yield _gauge("encoder_padding_efficiency", "Real tokens / padded tokens computed", efficiency)
    yield _gauge("encoder_uptime_seconds", "Seconds since the server started", status["uptime_s"])


def _per_model(status):
    """What status says of each served model, under a `model` label."""
    ready = GaugeMetricFamily("encoder_model_ready", "1 when every worker of the model is up", labels=["model"])
    alive = GaugeMetricFamily("encoder_model_workers_alive", "The model's workers heartbeating", labels=["model"])
    depth = GaugeMetricFamily("encoder_model_queue_depth", "The model's jobs queued in the ventilator",
                              labels=["model", "queue"])
    texts = CounterMetricFamily("encoder_model_texts_encoded", "Texts (a reranker's: documents) the model computed",
                                labels=["model"])
    for name, model in status["models"].items():
        ready.add_metric([name], float(model["ready"]))
        alive.add_metric([name], model["workers_alive"])
        texts.add_metric([name], model["texts_encoded"])
        for queue, jobs in model["queue_depth"].items():
            depth.add_metric([name, queue], jobs)
    yield from (ready, alive, depth, texts)


def _gauge(name, help_text, value):
    return GaugeMetricFamily(name, help_text, value=float(value))


def _histogram(name, help_text, hist):
    """A HistogramMetricFamily from the server's non-cumulative counts."""
    cumulative, buckets = 0, []
    for bound, count in zip(hist["buckets"], hist["counts"]):
        cumulative += count
        buckets.append((_bound(bound), cumulative))
    buckets.append(("+Inf", cumulative + hist["counts"][-1]))
    return HistogramMetricFamily(name, help_text, buckets=buckets, sum_value=hist["sum"])


def _bound(value):
    return repr(float(value))


class HttpMetricsMiddleware:
    """ASGI middleware counting each HTTP request by route template and status, and timing it."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.observe(route, scope["method"], status[0], time.perf_counter() - started)
