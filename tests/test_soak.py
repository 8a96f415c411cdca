"""The soak run of benchmark/soak.py on the tiny model, in CI: 16 clients, 20,000 mixed-size
requests, two workers killed with kill -9 along the way."""
import json

import pytest

from benchmark.engines import Service
from benchmark.soak import Soak

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_soak_loses_and_duplicates_no_row_and_memory_stays_flat(tiny_model, tmp_path):
    pool = [f"soak text number {i} " + " ".join(["word"] * (i % 40)) for i in range(1000)]
    with Service("soak", ["--num-worker", "2"], tiny_model, log_dir=tmp_path) as service:
        report = Soak(service, pool, clients=16, requests=20000, kills=2).run()
    print(json.dumps(report, indent=2))
    assert report["failed_requests"] == 0, report["failures"]
    assert report["requests"] == 20000 and report["worker_restarts"] == 2
    assert report["status_ready_after"]
    assert report["max_rss_growth_mb"] < 50, report["rss_growth_mb"]
