"""The histograms behind /metrics: bucketing, worker deltas and merging."""
from encoder_server.server.metrics import BUCKETS, Histogram, Metrics


def test_a_value_lands_in_the_first_bucket_it_does_not_exceed():
    histogram = Histogram((1, 2, 4))
    for value in (0.5, 1, 1.5, 4, 9):
        histogram.observe(value)
    assert histogram.counts == [2, 1, 1, 1]  # <=1: 0.5 and 1; <=2: 1.5; <=4: 4; above: 9
    assert histogram.count == 5 and histogram.sum == 16


def test_take_returns_the_delta_and_starts_again():
    metrics = Metrics()
    metrics.record_pass(rows=4, real_tokens=30, padded_tokens=40, seconds=0.02)
    metrics.observe("queue_seconds", 0.003)
    delta = metrics.take()
    assert delta["passes"] == 1 and delta["tokens"] == {"real": 30, "padded": 40}
    assert delta["histograms"]["batch_rows"]["count"] == 1
    assert delta["histograms"]["queue_seconds"]["sum"] == 0.003
    assert metrics.take()["passes"] == 0


def test_deltas_add_up_in_the_ventilator():
    totals, worker = Metrics(), Metrics()
    for rows in (1, 8, 64):
        worker.record_pass(rows=rows, real_tokens=rows * 10, padded_tokens=rows * 12, seconds=0.01)
        totals.add(worker.take())
    snapshot = totals.snapshot()
    rows = snapshot["histograms"]["batch_rows"]
    assert rows["count"] == 3 and rows["sum"] == 73
    assert sum(rows["counts"]) == 3 and rows["buckets"] == list(BUCKETS["batch_rows"])
    assert snapshot["tokens"] == {"real": 730, "padded": 876}


def test_foreign_buckets_are_ignored_not_mixed():
    totals = Metrics()
    foreign = {"histograms": {"batch_rows": {"buckets": [1, 3], "counts": [1, 0, 0], "sum": 1, "count": 1}}}
    totals.add(foreign)
    assert totals.snapshot()["histograms"]["batch_rows"]["count"] == 0
