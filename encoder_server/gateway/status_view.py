"""GET /status.json: the cached server status plus what the gateway derives from its samples."""
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
        "status": status,
        "throughput": {
            "texts_per_s": rate(samples, lambda s: s["texts"]["encoded"], THROUGHPUT_WINDOW_S),
            "requests_per_s": rate(samples, lambda s: s["requests"]["served"], THROUGHPUT_WINDOW_S),
        },
        "latency_ms": {name: _quantiles_ms(samples, name)
                       for name in ("request_seconds", "queue_seconds", "inference_seconds")},
        "padding_efficiency": padding_efficiency(status),
    }


def _quantiles_ms(samples, name):
    hist, window = recent_histogram(samples, name, LATENCY_WINDOW_S)
    if hist is None:
        return None
    ms = {f"p{round(q * 100)}": _ms(quantile(hist, q)) for q in (0.5, 0.95)}
    return {**ms, "count": hist["count"], "window_s": window}


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000, 2)
