"""A worker: a prefetch thread receives and tokenizes jobs while the main thread runs the model.

Sockets: `jobs` (DEALER to the ventilator, used by the prefetch thread only) and `results`
(PUSH to the sink, used by the compute loop only).
"""
import os
import threading

import zmq

from . import messages
from .backends import load_encoder
from .batching import BatchPlanner, drain
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
                        self.buffered.notify()
        except Exception:
            self.log.exception("prefetch failed; stopping this worker")
            self.failed = True
            self.stop.set()
        finally:
            jobs.close(linger=0)

    def compute(self):
        results = make_socket(zmq.Context.instance(), zmq.PUSH, connect=self.addresses.sink)
        try:
            while not self.stop.is_set():
                with self.buffered:
                    self.buffered.wait_for(lambda: self.planner or self.stop.is_set(), timeout=POLL_MS / 1000)
                    batch = self.planner.next_pass()
                if batch is not None:
                    for job in batch.scatter(self.encoder.embed(batch)):
                        results.send_multipart(
                            messages.part_frames(job.seq, job.job_id, job.offset, job.result(), job.tokens),
                            copy=False)
        finally:
            results.close(linger=1000)


def run_worker(settings, addresses, index):
    name = f"worker-{index}"
    log, stop = start_child(name, settings.verbose)
    worker = Worker(settings, addresses, f"{name}:{os.getpid()}", log, stop)
    prefetcher = threading.Thread(target=worker.prefetch, name="prefetch", daemon=True)
    prefetcher.start()
    log.info("serving on %s with %d thread(s)", settings.device, settings.threads_per_worker)
    try:
        worker.compute()
    finally:
        stop.set()
        prefetcher.join(timeout=2)
    if worker.failed:
        raise SystemExit(1)
    log.info("stopped")
