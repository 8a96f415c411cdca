"""Latency and batch histograms, merged from every worker into the ventilator's status. Pure.

Workers record each forward pass and send what they recorded since the last heartbeat with it;
the ventilator adds these deltas up and records each request's end-to-end time. Buckets are
Prometheus-style upper bounds (a value lands in the first bucket it does not exceed).
"""
import threading
from bisect import bisect_left

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BUCKETS = {
    "queue_seconds": LATENCY_BUCKETS,       # per job: admitted by the ventilator -> its first pass starts
    "inference_seconds": LATENCY_BUCKETS,   # per forward pass
    "request_seconds": LATENCY_BUCKETS,     # per request: admitted -> its last part reaches the sink
    "batch_rows": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    "batch_padded_tokens": (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
}


def check_delta(snapshot):
    """`snapshot` itself (a worker's Metrics.take(), already shaped as status.Metrics), once every
    histogram is one of ours with counts that fit its buckets and every number is finite and not
    negative; ValueError otherwise."""
    for name, histogram in snapshot["histograms"].items():
        buckets = BUCKETS.get(name)
        counts = histogram.get("counts") if isinstance(histogram, dict) else None
        if buckets is None or not isinstance(counts, list) or len(counts) != len(buckets) + 1:
            raise ValueError(f"histogram {name[:32]!r} is not one of ours or does not fit its buckets")
        _check_amounts([*counts, histogram.get("sum"), histogram.get("count")], f"histogram {name}")
    _check_amounts([*snapshot["tokens"].values(), snapshot["passes"], snapshot["truncated"]], "metrics")
    return snapshot


def _check_amounts(values, where):
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise ValueError(f"{where} holds {str(value)[:32]}, not a finite amount")


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one counts values above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value):
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def add(self, snapshot):
        if tuple(snapshot["buckets"]) != self.buckets:
            return  # another server version's buckets: not comparable
        self.counts = [mine + theirs for mine, theirs in zip(self.counts, snapshot["counts"])]
        self.sum += snapshot["sum"]
        self.count += snapshot["count"]

    def snapshot(self):
        return {"buckets": list(self.buckets), "counts": list(self.counts), "sum": self.sum, "count": self.count}


class Metrics:
    """Histograms, the real and padded token totals of the passes run, and the texts truncated. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._reset()

    def observe(self, name, value):
        with self._lock:
            self.histograms[name].observe(value)

    def record_pass(self, rows, real_tokens, padded_tokens, seconds):
        with self._lock:
            self.histograms["batch_rows"].observe(rows)
            self.histograms["batch_padded_tokens"].observe(padded_tokens)
            self.histograms["inference_seconds"].observe(seconds)
            self.tokens["real"] += real_tokens
            self.tokens["padded"] += padded_tokens
            self.passes += 1

    def count_truncated(self, texts):
        with self._lock:
            self.truncated += texts

    def add(self, snapshot):
        """Add another Metrics' snapshot (a worker's delta) to these totals."""
        with self._lock:
            for name, histogram in snapshot.get("histograms", {}).items():
                if name in self.histograms:
                    self.histograms[name].add(histogram)
            for kind in self.tokens:
                self.tokens[kind] += snapshot.get("tokens", {}).get(kind, 0)
            self.passes += snapshot.get("passes", 0)
            self.truncated += snapshot.get("truncated", 0)

    def snapshot(self):
        with self._lock:
            return self._snapshot()

    def take(self):
        """The snapshot, then start again from zero (a worker's delta since its last heartbeat)."""
        with self._lock:
            snapshot = self._snapshot()
            self._reset()
            return snapshot

    def _snapshot(self):
        return {"histograms": {name: h.snapshot() for name, h in self.histograms.items()},
                "tokens": dict(self.tokens), "passes": self.passes, "truncated": self.truncated}

    def _reset(self):
        self.histograms = {name: Histogram(buckets) for name, buckets in BUCKETS.items()}
        self.tokens = {"real": 0, "padded": 0}
        self.passes = 0
        self.truncated = 0
