"""encoder_server.server.worker.Worker's lanes, on real threads and the tiny model: a job wakes the
lane that will run it, and the express lane runs small requests' rows only while every other lane
is on a bulk pass. The model's forward pass is held while the test says so, so that the test, not
the clock, decides when a bulk pass ends."""
import contextlib
import itertools
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from conftest import settled_status, wait_for
from encoder_server.server import messages
from encoder_server.server import worker as worker_module
from encoder_server.server.sockets import WorkerEndpoints
from encoder_server.server.worker import EXPRESS, Worker
from encoder_server.settings import resolve

# one endpoint per test: ZeroMQ releases a closed socket's inproc address in its own time
RESULTS = (f"inproc://worker-test-results-{number}" for number in itertools.count())


class HeldWorker:
    """A Worker whose lane-0 and express lane run on threads; passes of more than one row wait for
    `release`. `ran` lists the lane that ran each pass."""

    def __init__(self, tiny_model):
        settings = resolve(model=str(tiny_model), backend="torch", num_worker=1)
        results = next(RESULTS)
        self.results = zmq.Context.instance().socket(zmq.PULL)
        self.results.bind(results)
        self.stop, self.release, self.ran = threading.Event(), threading.Event(), []
        self.worker = Worker(settings, WorkerEndpoints(jobs="inproc://unused", results=results), "test",
                             logging.getLogger("worker-test"), self.stop)
        model_run = self.worker.model.run

        def run(inputs, alone=False):
            self.ran.append(threading.current_thread().name)
            if len(inputs.input_ids) > 1:
                assert self.release.wait(30), "the test never released the bulk pass"
            return model_run(inputs, alone=alone)

        self.worker.model.run = run
        self.threads = [threading.Thread(target=self.worker.compute, args=(lane,), name=lane, daemon=True)
                        for lane in ("lane-0", EXPRESS)]
        for thread in self.threads:
            thread.start()

    def take(self, job_id, texts, priority):
        self.worker.take(messages.Job(job_id, job_id, 0, texts, priority=priority), 0.0)

    def finished(self, timeout_ms=10000):
        """The job ids of the next Parts message, or None when none comes in time."""
        if not self.results.poll(timeout_ms):
            return None
        return [part.job_id for part in messages.decode(self.results.recv_multipart()).parts]

    def close(self):
        self.release.set()
        self.stop.set()
        for thread in self.threads:
            thread.join(10)
        self.worker.close()
        self.results.close(linger=0)


@pytest.fixture
def held(tiny_model):
    worker = HeldWorker(tiny_model)
    yield worker
    worker.close()


def test_a_small_request_runs_on_the_express_lane_while_every_lane_is_on_a_bulk_pass(held):
    assert held.worker.lanes == 1
    assert held.worker.model.tokenizer.python_pieces  # one tokenizing thread: Python's WordPiece
    held.take(1, [f"bulk text number {i}" for i in range(8)], priority=False)
    wait_for(lambda: held.ran == ["lane-0"], timeout=10)
    held.take(2, ["a small request"], priority=True)
    assert held.finished() == [2], "the small request waited for the bulk pass"
    assert held.ran == ["lane-0", EXPRESS]
    held.release.set()
    assert held.finished() == [1]


def test_the_express_lane_leaves_small_requests_to_an_idle_lane(held):
    for job_id in range(1, 4):
        held.take(job_id, ["a small request"], priority=True)
        assert held.finished() == [job_id]
    held.take(4, [f"bulk text number {i}" for i in range(8)], priority=False)
    held.release.set()
    assert held.finished() == [4]
    assert held.ran == ["lane-0"] * 4


def test_jobs_are_tokenized_on_as_many_threads_as_asked(tiny_model):
    """Three tokenizing threads take three bulk jobs at once (each waits at a barrier of three inside
    the tokenizer, which one thread alone would never pass), and every job's rows still come back."""
    settings = resolve(model=str(tiny_model), backend="torch", num_worker=1, tokenizer_threads=3)
    results = next(RESULTS)
    sink = zmq.Context.instance().socket(zmq.PULL)
    sink.bind(results)
    stop, together = threading.Event(), threading.Barrier(3, timeout=20)
    worker = Worker(settings, WorkerEndpoints(jobs="inproc://unused", results=results), "test",
                    logging.getLogger("worker-test"), stop)
    tokenize, tokenizing = worker.model.tokenize, []

    def tokenize_together(*args, **kwargs):
        tokenizing.append(threading.current_thread().name)
        together.wait()
        return tokenize(*args, **kwargs)

    worker.model.tokenize = tokenize_together
    threads = [threading.Thread(target=worker.prefetch, args=(f"prefetch-{n}",), name=f"prefetch-{n}")
               for n in range(3)] + [threading.Thread(target=worker.compute, args=("lane-0",))]
    for thread in threads:
        thread.start()
    try:
        texts = {job_id: [f"text {job_id}.{i}" for i in range(5)] for job_id in (1, 2, 3)}
        for job_id, job_texts in texts.items():
            worker.received.put((messages.Job(job_id, job_id, 0, job_texts), 0.0))
        finished = {}
        while len(finished) < 3 and sink.poll(20000):
            finished.update((part.job_id, part.array) for part in messages.decode(sink.recv_multipart()).parts)
        assert sorted(tokenizing) == ["prefetch-0", "prefetch-1", "prefetch-2"]
        assert worker.model.tokenizer.python_pieces is False  # they need tokenizers, which lets go of the GIL
        assert sorted(finished) == [1, 2, 3] and not worker.failed
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        worker.close()
        sink.close(linger=0)
    worker.model.tokenize = tokenize
    for job_id, rows in finished.items():
        np.testing.assert_allclose(rows, worker.model.embed_texts(texts[job_id]), atol=1e-6)


def _voluntary_switches(pid):
    """How often the threads of process `pid` have blocked so far (each wake-up from a wait is one)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            status = (task / "status").read_text()
            total += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return total


def test_an_idle_worker_sleeps_until_work_or_stop_wakes_it(tiny_server):
    """tiny_server's workers have 7 threads each that wait for work. Waking every 100 ms to look
    for it (about 90 wake-ups a second in all, 8 ms of CPU a second per idle worker) is not
    needed: a job, a report to send and stop each wake the thread concerned, and the heartbeats
    keep intake busy once a second."""
    with tiny_server.client() as client:
        settled_status(client)
    pids = tiny_server.worker_pids()
    before = {pid: _voluntary_switches(pid) for pid in pids}
    time.sleep(3)
    rates = {pid: (_voluntary_switches(pid) - before[pid]) / 3 for pid in pids}
    assert len(rates) == 2 and all(rate < 40 for rate in rates.values()), rates


def test_stop_wakes_the_threads_that_wait_for_work(tiny_model, monkeypatch):
    """Waiting lanes and tokenizing threads end on stop because stop wakes them: here no wait of
    theirs would end by itself within the test."""
    monkeypatch.setattr(worker_module, "IDLE_WAIT_S", 3600)
    held = HeldWorker(tiny_model)  # its lane-0 and express lane wait for work
    waiting = [threading.Thread(target=held.worker.prefetch, args=(f"prefetch-{number}",), daemon=True)
               for number in range(2)]
    waiting.append(threading.Thread(target=held.worker.wake_on_stop, daemon=True))
    for thread in waiting:
        thread.start()
    try:
        time.sleep(0.5)  # so that each is in its wait, not before it, when stop comes
        held.stop.set()
        for thread in [*waiting, *held.threads]:
            thread.join(10)
        assert not [thread.name for thread in [*waiting, *held.threads] if thread.is_alive()]
    finally:
        held.close()


def test_a_closed_worker_leaves_its_wake_up_pipe_closed(tiny_model):
    """Once its threads have ended and it is closed, no descriptor of this process is left on the
    pipe that woke the worker's intake: a process that makes worker after worker does not run out."""
    held = HeldWorker(tiny_model)
    pipe = {_open_files()[fd] for fd in held.worker.intake_wake}  # "pipe:[inode]"
    held.close()
    assert not pipe & set(_open_files().values())


def _open_files():
    """{descriptor: what it is ("pipe:[inode]", a path, ...)} of this process."""
    files = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own, closed by now
            files[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
    return files
