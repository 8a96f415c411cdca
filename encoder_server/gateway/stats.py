"""Figures derived from successive status samples: rates, and latency quantiles from histograms.

A sample is (monotonic time, status dict). Histograms are the server's: ascending upper `buckets`
and non-cumulative `counts`, one more than the buckets (the last counts values above the largest).
"""


def rate(samples, read, window):
    """Per-second increase of `read(status)` over about the last `window` seconds, or None."""
    if len(samples) < 2:
        return None
    (start, old), (end, new) = _window(samples, window), samples[-1]
    if end <= start:
        return None
    return max(0.0, (read(new) - read(old)) / (end - start))


def recent_histogram(samples, name, window):
    """The histogram of the last `window` seconds (since start when nothing new came in it), and
    the window it covers in seconds (None: since the server started)."""
    newest = histogram(samples[-1][1], name) if samples else None
    if newest is None:
        return None, None
    start, old_status = _window(samples, window)
    old = histogram(old_status, name)
    if old and old["buckets"] == newest["buckets"] and newest["count"] > old["count"]:
        counts = [a - b for a, b in zip(newest["counts"], old["counts"])]
        delta = {"buckets": newest["buckets"], "counts": counts, "count": newest["count"] - old["count"],
                 "sum": newest["sum"] - old["sum"]}
        return delta, round(samples[-1][0] - start, 1)
    return newest, None


def quantile(hist, q):
    """Estimate the q-quantile, interpolating linearly inside its bucket (as Prometheus does)."""
    if not hist or not hist["count"]:
        return None
    bounds, rank, seen, lower = hist["buckets"], q * hist["count"], 0, 0.0
    for index, count in enumerate(hist["counts"]):
        if index == len(bounds):
            return bounds[-1] if bounds else None  # above the largest bound: all we know
        if count and seen + count >= rank:
            return lower + (bounds[index] - lower) * (rank - seen) / count
        seen += count
        lower = bounds[index]
    return bounds[-1] if bounds else None


def histogram(status, name):
    return status["metrics"]["histograms"][name] if status else None


def padding_efficiency(status):
    """Real tokens / padded tokens computed so far, or None."""
    tokens = status["metrics"]["tokens"] if status else None
    return tokens["real"] / tokens["padded"] if tokens and tokens["padded"] else None


def _window(samples, window):
    """The oldest sample no older than `window` seconds before the newest (never the newest itself
    when an older one exists)."""
    newest = samples[-1][0]
    for sample in samples[:-1]:
        if newest - sample[0] <= window:
            return sample
    return samples[-2] if len(samples) > 1 else samples[-1]
