"""GET /status.json: the cached server status plus what the gateway derives from its samples, with
no process ids: the route stays open under --api-key, for the status page's script."""
import time

from .stats import padding_efficiency, quantile, rate, recent_histogram

THROUGHPUT_WINDOW_S = 5.0
LATENCY_WINDOW_S = 60.0
CONFIG_SHOWN = ("model_name", "model", "max_seq_len", "normalize", "pooling_strategy", "num_worker", "backend",
                "device", "max_batch_tokens", "server_version")


def status_view(link):
    samples, status = list(link.samples), link.status
    return {
        "reachable": status is not None,
        "ready": link.not_ready() is None,
        "reason": link.not_ready(),
        "age_s": None if link.polled_at is None else round(time.monotonic() - link.polled_at, 1),
        "model": link.model,
        "config": {key: link.config[key] for key in CONFIG_SHOWN if key in link.config},
        "models": [{"name": model.get("model_name"), "kind": model.get("kind", "embed"),
                    "dimensions": model.get("embedding_dim"),
                    "ready": status["models"].get(model.get("model_name"), {}).get("ready") if status else None}
                   for model in link.models],
        "status": _without_pids(status),
        "throughput": {
            "texts_per_s": rate(samples, lambda s: s["texts"]["encoded"], THROUGHPUT_WINDOW_S),
            "requests_per_s": rate(samples, lambda s: s["requests"]["served"], THROUGHPUT_WINDOW_S),
        },
        "latency_ms": {name: _quantiles_ms(samples, name)
                       for name in ("request_seconds", "queue_seconds", "inference_seconds")},
        "padding_efficiency": padding_efficiency(status),
    }


PER_WORKER = ("worker_busy_texts", "worker_texts_encoded")


def _without_pids(status):
    if status is None:
        return None
    return {**status, **{field: by_worker_name(status[field]) for field in PER_WORKER if field in status}}


def by_worker_name(per_worker):
    """{worker: count} keyed by the worker's name alone: `worker-0` for `worker-0:4711`, `host/worker-1`
    for a remote `host/worker-1:815`. Two processes of one name (a restarted worker whose
    predecessor is still counted) are added together."""
    merged = {}
    for worker, count in per_worker.items():
        name, colon, pid = worker.rpartition(":")
        name = name if colon and pid.isdigit() else worker
        merged[name] = merged.get(name, 0) + count
    return merged


def _quantiles_ms(samples, name):
    hist, window = recent_histogram(samples, name, LATENCY_WINDOW_S)
    if hist is None:
        return None
    ms = {f"p{round(q * 100)}": _ms(quantile(hist, q)) for q in (0.5, 0.95)}
    return {**ms, "count": hist["count"], "window_s": window}


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000, 2)
