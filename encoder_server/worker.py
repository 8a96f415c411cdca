"""A worker: a prefetch thread receives and tokenizes jobs while two lanes run the model.

The priority lane runs small requests, the bulk lane split ones, each on its own thread, so a
small request never waits for a bulk pass to finish. Sockets: `jobs` (DEALER to the ventilator,
prefetch thread only) and one `results` PUSH to the sink per lane.

The prefetch thread also sends the ventilator a heartbeat every HEARTBEAT_INTERVAL, with the
metrics recorded since the last one, unless a lane has been stuck in one pass for STALL_LIMIT:
then the worker falls silent and is replaced. When it has not heard the ventilator's heartbeat for
HEARTBEAT_LIVENESS intervals (a server restart, a broken network), it connects again and says
READY anew, as in the ZeroMQ Guide's Paranoid Pirate.
"""
import os
import socket
import threading
import time

import zmq

from . import fault_injection, messages
from .backends import load_encoder
from .batching import BULK, PRIORITY, BatchPlanner, drain
from .metrics import Metrics
from .runtime import HEARTBEAT_INTERVAL, HEARTBEAT_LIVENESS, POLL_MS, make_socket, start_child
from .scheduling import Job
from .tokenizer import TextTokenizer

STALL_LIMIT = 120.0

WARMUP_TEXTS = ["warm up the model", "a second, somewhat longer sentence to warm up the model"]


class Worker:
    def __init__(self, settings, endpoints, name, log, stop, remote=False):
        self.name = name
        self.log = log
        self.stop = stop
        self.endpoints = endpoints
        self.remote = remote
        self.metrics = Metrics()
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
        jobs = self.connect_jobs()
        heard = next_beat = time.monotonic()
        try:
            while not self.stop.is_set():
                if jobs.poll(POLL_MS):
                    frames = jobs.recv_multipart()
                    heard = time.monotonic()
                    if frames[0] == messages.JOB:
                        self.take(messages.decode_job(frames), jobs)
                if time.monotonic() >= next_beat and not self.stalled():
                    jobs.send_multipart(messages.heartbeat_frames(self.metrics.take()))
                    next_beat = time.monotonic() + HEARTBEAT_INTERVAL
                if time.monotonic() - heard > HEARTBEAT_INTERVAL * HEARTBEAT_LIVENESS and not self.stalled():
                    self.log.warning("no heartbeat from the ventilator in %.0fs; connecting again",
                                     time.monotonic() - heard)
                    jobs.close(linger=0)
                    jobs, heard = self.connect_jobs(), time.monotonic()
        except Exception:
            self.log.exception("prefetch failed; stopping this worker")
            self.failed = True
            self.stop.set()
        finally:
            jobs.close(linger=0)

    def connect_jobs(self):
        jobs = make_socket(zmq.Context.instance(), zmq.DEALER, connect=self.endpoints.jobs,
                           identity=self.name.encode(), curve_client=self.endpoints.curve)
        jobs.send_multipart(messages.ready_frames(os.getpid(), socket.gethostname(), self.remote))
        return jobs

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
        results = make_socket(zmq.Context.instance(), zmq.PUSH, connect=self.endpoints.results,
                              curve_client=self.endpoints.curve)
        try:
            while not self.stop.is_set():
                batch = self._next_pass(lane)
                if batch is not None:
                    pooled = self.run_pass(lane, batch)
                    for job in batch.scatter(pooled):
                        results.send_multipart(
                            messages.part_frames(job.seq, job.job_id, job.offset, job.result(), job.tokens,
                                                 job.num_tokens), copy=False)
        except Exception:
            self.log.exception("%s lane failed; stopping this worker", lane)
            self.failed = True
            self.stop.set()
        finally:
            results.close(linger=1000)

    def run_pass(self, lane, batch):
        for wait in batch.start(time.time()):
            self.metrics.observe("queue_seconds", wait)
        started = self.pass_started[lane] = time.monotonic()
        pooled = self.encoder.embed(batch)
        del self.pass_started[lane]
        self.metrics.record_pass(len(batch.rows), batch.real_tokens, batch.padded_tokens, time.monotonic() - started)
        return pooled

    def _next_pass(self, lane):
        with self.buffered:
            ready = lambda: self.planner.ready(lane, self.batch_wait_s) or self.stop.is_set()  # noqa: E731
            # with a batch wait, wake up in time to run rows whose wait is over
            timeout = min(POLL_MS / 1000, self.batch_wait_s or POLL_MS / 1000)
            if not self.buffered.wait_for(ready, timeout=timeout) or self.stop.is_set():
                return None
            return self.planner.next_pass(lane)


def run_worker(settings, endpoints, index, remote=False):
    name = f"{socket.gethostname()}/worker-{index}" if remote else f"worker-{index}"
    log, stop = start_child(name, settings.verbose)
    worker = Worker(settings, endpoints, f"{name}:{os.getpid()}", log, stop, remote)
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
