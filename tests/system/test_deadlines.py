"""Client deadlines: a request whose client has given up is never computed, also by a worker whose
clock is off."""
import os
import re
from datetime import datetime

import pytest

from conftest import FAULTS, random_texts, running_server, wait_for

pytestmark = pytest.mark.timeout(300)

# A request too large for the priority queue, so the worker's prefetch (not its intake, which
# stamps each job's arrival) holds it, and the jobs received meanwhile, for 2 s.
HELD = ["!sleep 2", *random_texts(16, seed=7)]


def test_request_whose_client_timed_out_is_never_computed(tiny_model, tmp_path):
    with running_server(tiny_model, "--num-worker", "1", "--prefetch-size", "1", tmp_path=tmp_path,
                        env=FAULTS) as server:
        _time_out_behind_a_held_request(server)
        assert_never_computed(server, expired=300, encoded=len(HELD))


# Loaded by every process of a server started with this folder on PYTHONPATH; it puts the wall
# clock of worker processes (and theirs only) `ENCODER_TEST_WORKER_CLOCK_SKEW` seconds off.
SKEWED_WORKER_CLOCK = """
import multiprocessing, os, time
_skew, _wall = float(os.environ["ENCODER_TEST_WORKER_CLOCK_SKEW"]), time.time
time.time = lambda: _wall() + (_skew if multiprocessing.current_process().name.startswith("worker") else 0.0)
"""


@pytest.mark.parametrize("skew", [30.0, -30.0])
def test_a_worker_whose_clock_is_off_computes_live_jobs_and_drops_dead_ones(tiny_model, tmp_path, skew):
    """Deadlines travel as budgets: a worker 30 s ahead must not drop what clients still wait for,
    and one 30 s behind must not compute what they gave up on."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SKEWED_WORKER_CLOCK)
    env = {**FAULTS, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "ENCODER_TEST_WORKER_CLOCK_SKEW": str(skew)}
    with running_server(tiny_model, "--num-worker", "1", "--prefetch-size", "1", tmp_path=tmp_path,
                        env=env) as server:
        assert abs(_worker_clock_offset(server.log) - skew) < 5, server.log
        with server.client(timeout=5) as live:
            assert live.encode(random_texts(100, seed=8)).shape == (100, 32)
        _time_out_behind_a_held_request(server)
        assert_never_computed(server, expired=300, encoded=100 + len(HELD))
        waits = server.status()["metrics"]["histograms"]["queue_seconds"]
        assert waits["count"] and waits["sum"] / waits["count"] < 3, waits  # not 30 s off either


def _time_out_behind_a_held_request(server):
    """A client that waits 0.5 s sends 300 texts while a patient client's HELD request keeps the
    worker busy for 2 s: the hasty one times out, the patient one gets its rows."""
    with server.client(timeout=30) as patient, server.client(timeout=0.5) as hasty:
        patient.encode(HELD, blocking=False)
        wait_for(lambda: server.status()["in_flight_requests"] == 1)
        with pytest.raises(TimeoutError):
            hasty.encode(random_texts(300, seed=9))
        assert len(patient.fetch_all(concat=True)) == len(HELD)


def _worker_clock_offset(log):
    """Seconds between the worker's and the ventilator's clocks, from the two lines each logs as
    the worker joins (a few milliseconds apart in real time)."""
    def stamp(pattern):
        line = next(line for line in log.splitlines() if re.search(pattern, line))
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return stamp(r"worker-0 INFO serving on") - stamp(r"ventilator INFO worker-0:\d+ ready")


def assert_never_computed(server, expired, encoded):
    """Once every text is accounted for (a worker reports the jobs it dropped a moment after it
    drops them), exactly `expired` texts were never computed and `encoded` were."""
    wait_for(lambda: sum(server.status()["texts"][kind] for kind in ("expired", "encoded")) >= expired + encoded)
    status = server.status()
    assert status["in_flight_requests"] == 0 and status["requests"]["expired"] == 1
    assert (status["texts"]["expired"], status["texts"]["encoded"]) == (expired, encoded)
