"""A worker's own work for jobs of BATCH short texts, warm, on one thread, in one process: the
zero backend's Worker (encoder_server/server/worker.py) taking JOBS messages of 8 such jobs (small
requests' jobs up to --priority-batch-size texts, bulk ones above), running their passes and
framing their PARTS, with no sockets and no other thread. It is what the served workers would
spend per job if serving cost them nothing more. It also counts the cyclic garbage collector's runs
over the timed rounds, and times them again with it frozen and off.

    PYTHONPATH=. python benchmark/results/issue31-pipeline/warm-worker.py [BATCH]
"""
import gc
import logging
import os
import sys
import threading
import time

os.environ["ENCODER_SERVER_ZERO_BACKEND"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
from benchmark import corpus  # noqa: E402
from encoder_server.server import messages  # noqa: E402
from encoder_server.server.batching import BULK, PRIORITY  # noqa: E402
from encoder_server.server.sockets import WorkerEndpoints  # noqa: E402
from encoder_server.server.worker import Worker  # noqa: E402
from encoder_server.settings import resolve  # noqa: E402

BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 32
JOBS, ROUNDS = 8, 2000
settings = resolve(backend="zero")
worker = Worker(settings, WorkerEndpoints(jobs="inproc://unused", results="inproc://unused"),
                "warm", logging.getLogger("warm"), threading.Event())
texts = corpus.texts("short", BATCH * JOBS)


def one_round(number):
    jobs = tuple(messages.Job(number * JOBS + j, number * JOBS + j, 0, texts[j * BATCH:(j + 1) * BATCH],
                              priority=BATCH <= settings.priority_batch_size, budget_ms=60_000) for j in range(JOBS))
    now = time.monotonic()
    for job in messages.decode(messages.Jobs(jobs).frames()).jobs:
        worker.take(job, now)
    while worker.planner:
        kind = PRIORITY if worker.planner.has(PRIORITY) else BULK
        batch = worker.planner.next_pass(kind)
        worker.running[kind] += 1
        finished = batch.scatter(worker.run_pass("lane-0", batch, kind, False))
        if finished:
            messages.Parts(tuple(map(worker.part, finished))).frames()


def timed(label):
    before = [stats["collections"] for stats in gc.get_stats()]
    started = time.perf_counter()
    for number in range(ROUNDS):
        one_round(number)
    per_job = 1e6 * (time.perf_counter() - started) / (ROUNDS * JOBS)
    collections = [stats["collections"] - count for stats, count in zip(gc.get_stats(), before)]
    print(f"{label}: {per_job:.0f} µs a job of {BATCH} texts ({per_job / BATCH:.1f} a text), "
          f"collections by generation {collections}")


for number in range(200):
    one_round(number)
timed("gc on")
gc.freeze()
timed("gc frozen")
gc.disable()
timed("gc off")
