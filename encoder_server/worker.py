"""A worker: a prefetch thread receives and tokenizes jobs while two lanes run the model.

The priority lane runs small requests, the bulk lane split ones, each on its own thread, so a
small request never waits for a bulk pass to finish. Sockets: `jobs` (DEALER to the ventilator,
prefetch thread only) and one `results` PUSH to the sink per lane.

The prefetch thread also sends the ventilator a heartbeat every HEARTBEAT_INTERVAL, unless a
lane has been stuck in one pass for STALL_LIMIT: then the worker falls silent and is replaced.
"""
import os
import socket
import threading
import time

import zmq

from . import fault_injection, messages
from .backends import load_encoder
from .batching import BULK, PRIORITY, BatchPlanner, drain
from .runtime import HEARTBEAT_INTERVAL, POLL_MS, make_socket, start_child
from .scheduling import Job
from .tokenizer import TextTokenizer

STALL_LIMIT = 120.0

WARMUP_TEXTS = ["warm up the model", "a second, somewhat longer sentence to warm up the model"]


class Worker:
    def __init__(self, settings, addresses, name, log, stop):
        self.name = name
        self.log = log
        self.stop = stop
        self.addresses = addresses
        self.tokenizer = TextTokenizer(settings.model, settings.truncate_at)
        self.encoder = load_encoder(settings)
        self.planner = BatchPlanner(settings.max_batch_tokens, settings.max_batch_size, self.tokenizer.pad_id)
        self.batch_wait_s = settings.batch_wait_ms / 1000
        self.buffered = threading.Condition()
        self.failed = False
        self.pass_started = {}  # lane -> monotonic start of the pass it is running
        self.warm_up()

    def warm_up(self):
        self.planner.add(self.tokenizer.tokenize(Job(job_id=0, seq=0, offset=0, texts=WARMUP_TEXTS)))
        drain(self.planner, self.encoder.embed)

    def prefetch(self):
        jobs = make_socket(zmq.Context.instance(), zmq.DEALER, connect=self.addresses.backend,
                           identity=self.name.encode())
        jobs.send_multipart(messages.ready_frames(os.getpid(), socket.gethostname()))
        next_beat = time.monotonic() + HEARTBEAT_INTERVAL
        try:
            while not self.stop.is_set():
                if jobs.poll(POLL_MS):
                    self.take(messages.decode_job(jobs.recv_multipart()), jobs)
                if time.monotonic() >= next_beat and not self.stalled():
                    jobs.send(messages.HEARTBEAT)
                    next_beat = time.monotonic() + HEARTBEAT_INTERVAL
        except Exception:
            self.log.exception("prefetch failed; stopping this worker")
            self.failed = True
            self.stop.set()
        finally:
            jobs.close(linger=0)

    def take(self, job, jobs):
        if job.deadline is not None and time.time() > job.deadline:
            jobs.send_multipart(messages.number_frames(messages.DROPPED, job.job_id))
            return
        fault_injection.inject(job.texts)
        tokenized = self.tokenizer.tokenize(job)
        with self.buffered:
            self.planner.add(tokenized)
            self.buffered.notify_all()

    def stalled(self):
        now = time.monotonic()
        return any(now - started > STALL_LIMIT for started in list(self.pass_started.values()))

    def compute(self, lane):
        results = make_socket(zmq.Context.instance(), zmq.PUSH, connect=self.addresses.sink)
        try:
            while not self.stop.is_set():
                batch = self._next_pass(lane)
                if batch is not None:
                    self.pass_started[lane] = time.monotonic()
                    pooled = self.encoder.embed(batch)
                    del self.pass_started[lane]
                    for job in batch.scatter(pooled):
                        results.send_multipart(
                            messages.part_frames(job.seq, job.job_id, job.offset, job.result(), job.tokens),
                            copy=False)
        except Exception:
            self.log.exception("%s lane failed; stopping this worker", lane)
            self.failed = True
            self.stop.set()
        finally:
            results.close(linger=1000)

    def _next_pass(self, lane):
        with self.buffered:
            ready = lambda: self.planner.ready(lane, self.batch_wait_s) or self.stop.is_set()  # noqa: E731
            # with a batch wait, wake up in time to run rows whose wait is over
            timeout = min(POLL_MS / 1000, self.batch_wait_s or POLL_MS / 1000)
            if not self.buffered.wait_for(ready, timeout=timeout) or self.stop.is_set():
                return None
            return self.planner.next_pass(lane)


def run_worker(settings, addresses, index):
    name = f"worker-{index}"
    log, stop = start_child(name, settings.verbose)
    worker = Worker(settings, addresses, f"{name}:{os.getpid()}", log, stop)
    prefetcher = threading.Thread(target=worker.prefetch, name="prefetch", daemon=True)
    priority_lane = threading.Thread(target=worker.compute, args=(PRIORITY,), name="priority", daemon=True)
    prefetcher.start()
    priority_lane.start()
    log.info("serving on %s with %s, %d thread(s) per lane", settings.device, settings.backend,
             settings.threads_per_worker)
    try:
        worker.compute(BULK)
    finally:
        stop.set()
        priority_lane.join(timeout=10)
        prefetcher.join(timeout=2)
    if worker.failed:
        raise SystemExit(1)
    log.info("stopped")
