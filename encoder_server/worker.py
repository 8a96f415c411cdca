"""A worker: a prefetch thread receives and tokenizes jobs while two lanes run the model.

The priority lane runs small requests, the bulk lane split ones, each on its own thread, so a
small request never waits for a bulk pass to finish. Sockets: `jobs` (DEALER to the ventilator,
prefetch thread only) and one `results` PUSH to the sink per lane.
"""
import os
import threading

import zmq

from . import messages
from .backends import load_encoder
from .batching import BULK, PRIORITY, BatchPlanner, drain
from .runtime import POLL_MS, make_socket, start_child
from .scheduling import Job
from .tokenizer import TextTokenizer

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
        self.warm_up()

    def warm_up(self):
        self.planner.add(self.tokenizer.tokenize(Job(job_id=0, seq=0, offset=0, texts=WARMUP_TEXTS)))
        drain(self.planner, self.encoder.embed)

    def prefetch(self):
        jobs = make_socket(zmq.Context.instance(), zmq.DEALER, connect=self.addresses.backend,
                           identity=self.name.encode())
        jobs.send(messages.READY)
        try:
            while not self.stop.is_set():
                if jobs.poll(POLL_MS):
                    job = self.tokenizer.tokenize(messages.decode_job(jobs.recv_multipart()))
                    with self.buffered:
                        self.planner.add(job)
                        self.buffered.notify_all()
        except Exception:
            self.log.exception("prefetch failed; stopping this worker")
            self.failed = True
            self.stop.set()
        finally:
            jobs.close(linger=0)

    def compute(self, lane):
        results = make_socket(zmq.Context.instance(), zmq.PUSH, connect=self.addresses.sink)
        try:
            while not self.stop.is_set():
                batch = self._next_pass(lane)
                if batch is not None:
                    for job in batch.scatter(self.encoder.embed(batch)):
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
