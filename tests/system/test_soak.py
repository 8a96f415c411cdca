"""The soak run of benchmark/soak.py on the tiny model: 16 clients, mixed-size requests, workers
killed with kill -9 along the way. Every run has the short soak (2,000 requests, one kill); the
long one (20,000 requests, two kills) is selected explicitly: `pytest -m slow tests/system`."""
import json

import pytest

from benchmark.engines import Service
from benchmark.soak import Soak

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("requests, kills", [
    (2_000, 1),
    pytest.param(20_000, 2, marks=pytest.mark.slow),
], ids=["short", "long"])
def test_soak_loses_and_duplicates_no_row_and_memory_stays_flat(tiny_model, tmp_path, requests, kills):
    pool = [f"soak text number {i} " + " ".join(["word"] * (i % 40)) for i in range(1000)]
    with Service("soak", ["--num-worker", "2"], tiny_model, log_dir=tmp_path) as service:
        report = Soak(service, pool, clients=16, requests=requests, kills=kills).run()
    print(json.dumps(report, indent=2))
    assert report["failed_requests"] == 0, report["failures"]
    assert report["requests"] == requests and report["worker_restarts"] == kills
    assert report["status_ready_after"]
    assert report["max_rss_growth_mb"] < 50, report["rss_growth_mb"]
