"""A worker: it receives jobs, tokenizes them ahead of the model, and runs them in lanes.

Threads: `intake` alone uses the `jobs` socket (DEALER to the ventilator): it receives jobs,
stamps their arrival, sends heartbeats and reports the jobs it dropped or refused. The `prefetch`
threads (--tokenizer-threads; `tokenizers` releases the GIL, so they tokenize on as many cores;
a worker's one thread takes plain texts of a WordPiece model through model/word_pieces.py instead,
three times as fast in Python)
tokenize received jobs (the Embedder's first stage) ahead of the lanes, drop those whose budget
ran out before one reached them and refuse those with a text too long for a request that forbids
truncation. A small request's job (at most priority_batch_size texts, well under a millisecond
to tokenize) that finds nothing queued for prefetch is taken by intake itself: one thread
hand-off fewer on the path whose latency users feel. Intake never computes.
Each lane is a thread with its own `results` PUSH to the sink that runs one forward pass at a time,
small requests' rows first, and sends the parts of the jobs that pass finished in one message; the
lanes share the process's Embedder, and so one copy of the weights (ONNX Runtime's `run` is
thread-safe and releases the GIL). One more lane, the express lane, runs
small requests only, and only while every other lane is on a bulk pass, so that they never wait for
bulk passes to finish and yet do not oversubscribe the cores otherwise. A pass that starts while
no other runs and nothing else waits is alone: when this process has every core of the host, it
runs on the Embedder's lone session, which has them all. The batching logic is in batching.py;
the model is an Embedder (encoder_server.model).

No thread polls for work: a job wakes the thread that takes it, a report (Dropped, Refused)
wakes intake, and stop wakes them all (`wake_on_stop`); an idle worker's threads wake only for
the heartbeats and once each IDLE_WAIT_S, a safety net. A heartbeat carries the metrics recorded
since the last one. The worker falls silent, and so is replaced, when a stage has been stuck on
one step for STALL_LIMIT. When it has not heard the ventilator for HEARTBEAT_LIVENESS intervals
(a server restart, a broken network), it connects again and says READY anew, as in the ZeroMQ
Guide's Paranoid Pirate.
"""
import contextlib
import os
import queue
import socket
import threading
import time
from collections import Counter

import zmq

from encoder_client.protocol import BAD_REQUEST

from ..model.cpus import lone_lane_threads
from ..model.passes import on_a_fast_device, pass_cost_tokens
from ..model.prepare import open_model
from ..model.sample import SAMPLE
from ..processes import start_child
from . import fault_injection, messages
from .batching import BULK, PRIORITY, BatchPlanner, Tokenized
from .liveness import HEARTBEAT_INTERVAL, HEARTBEAT_LIVENESS
from .metrics import Metrics
from .sockets import LINGER_MS, POLL_MS, let_queued_messages_out, make_socket, send_frames, waiting

STALL_LIMIT = 120.0
# the longest a thread waiting for work sleeps: new work and stop wake it at once (an idle worker's
# seven-odd threads each waking 10 times a second cost it about 8 ms of CPU a second)
IDLE_WAIT_S = 1.0
EXPRESS = "express"
WARMUP_TEXTS = ["warm up the model", "a second, somewhat longer sentence to warm up the model"]


class Worker:
    def __init__(self, settings, endpoints, name, log, stop, remote=False, lone_threads=0):
        self.name = name
        self.lanes = settings.lanes
        self.tokenizer_threads = settings.tokenizer_threads
        self.log = log
        self.stop = stop
        self.endpoints = endpoints
        self.remote = remote
        self.metrics = Metrics()
        self.model_name = settings.name
        # an Embedder, a Reranker or a SparseEmbedder; several tokenizing threads run at once only
        # through tokenizers, which releases the GIL: Python's WordPiece is for a worker's one thread
        self.model = open_model(settings, lone_threads, python_pieces=settings.tokenizer_threads == 1)
        self.kind = settings.kind
        self.fast = on_a_fast_device(settings.device, settings.backend)
        self.planner = BatchPlanner(settings.max_batch_tokens, settings.max_batch_size, self.model.tokenizer.pad_id,
                                    pass_cost_tokens(settings.device, settings.backend))
        self.batch_wait_s = settings.batch_wait_ms / 1000
        self.received = queue.SimpleQueue()  # (job, monotonic arrival), from intake to prefetch
        self.outbox = queue.SimpleQueue()    # Dropped, Refused and Ready messages, for intake to send
        self.intake_wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # (read, write): a byte wakes intake
        # one lock over the planner and `running`, two conditions on it, so that a job wakes the lane
        # that will take it: the express lane only while every other lane runs bulk work
        lock = threading.Lock()
        self.buffered, self.express_wake = threading.Condition(lock), threading.Condition(lock)
        self.running = Counter()  # PRIORITY and BULK -> passes of that kind running now, under `buffered`
        self.failed = False
        self.busy_since = {}  # stage (prefetch or a lane) -> monotonic start of the step it is on
        self.model.warm_up(WARMUP_TEXTS)
        # the ranges its clients' int8 and uint8 rows are quantized with (the ventilator publishes them)
        self.calibration = self.model.calibration(SAMPLE) if settings.pools_one_vector else None

    # ----- intake: the jobs socket -----

    def intake(self):
        """Sleeps until a message, a report (`report`) or stop, or until its next heartbeat is due."""
        jobs = self.connect_jobs()
        heard = next_beat = time.monotonic()
        poller = zmq.Poller()
        for sock in (jobs, self.intake_wake[0]):
            poller.register(sock, zmq.POLLIN)
        try:
            while not self.stop.is_set():
                due_ms = (next_beat - time.monotonic()) * 1000
                events = dict(poller.poll(due_ms if due_ms > 0 else POLL_MS))  # overdue: while stalled
                if jobs in events:
                    for frames in waiting(jobs):
                        heard = time.monotonic()
                        self.on_message(frames, heard)
                if self.intake_wake[0] in events:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.intake_wake[0], 4096)
                self.send_outbox(jobs)
                if time.monotonic() >= next_beat and not self.stalled():
                    jobs.send_multipart(messages.Heartbeat(self.metrics.take()).frames())
                    next_beat = time.monotonic() + HEARTBEAT_INTERVAL
                if time.monotonic() - heard > HEARTBEAT_INTERVAL * HEARTBEAT_LIVENESS and not self.stalled():
                    self.log.warning("no heartbeat from the ventilator in %.0fs; connecting again",
                                     time.monotonic() - heard)
                    poller.unregister(jobs)
                    jobs.close(linger=0)
                    jobs, heard = self.connect_jobs(), time.monotonic()
                    poller.register(jobs, zmq.POLLIN)
        except Exception:
            self.fail("intake")
        finally:
            jobs.close(linger=0)

    def connect_jobs(self):
        jobs = make_socket(zmq.Context.instance(), zmq.DEALER, connect=self.endpoints.jobs,
                           identity=self.name.encode(), curve_client=self.endpoints.curve)
        jobs.send_multipart(self.ready().frames())
        return jobs

    def ready(self):
        return messages.Ready(os.getpid(), socket.gethostname(), self.remote, lanes=self.lanes,
                              tokenizers=self.tokenizer_threads, model=self.model_name,
                              calibration=self.calibration, protocol=messages.INTERNAL_PROTOCOL, fast=self.fast)

    def on_message(self, frames, arrived):
        message = messages.decode_or_log(frames, self.log, "the ventilator")
        if isinstance(message, messages.Jobs):
            for job in message.jobs:
                if job.priority and self.received.empty():
                    self.take(job, arrived)  # a small request's job: no hand-off to prefetch
                else:
                    self.received.put((job, arrived))
        elif isinstance(message, messages.Who):
            self.log.info("the ventilator does not know this worker (it restarted); saying READY again")
            self.report(self.ready())

    def report(self, message):
        """Have intake send `message` to the ventilator now, whichever thread calls."""
        self.outbox.put(message)
        self.wake_intake()

    def wake_intake(self):
        with contextlib.suppress(BlockingIOError):  # full: intake has wake-ups enough to read
            os.write(self.intake_wake[1], b"\0")

    def send_outbox(self, jobs):
        while not self.outbox.empty():
            jobs.send_multipart(self.outbox.get().frames())

    def stalled(self):
        now = time.monotonic()
        return any(now - started > STALL_LIMIT for started in list(self.busy_since.values()))

    # ----- prefetch: tokenize ahead of the model -----

    def prefetch(self, stage):
        """A tokenizing thread's loop; `stage` is its name."""
        try:
            while not self.stop.is_set():
                try:
                    received = self.received.get(timeout=IDLE_WAIT_S)
                except queue.Empty:
                    continue
                if received is None:  # wake_on_stop's: passed on to the next tokenizing thread
                    self.received.put(None)
                    break
                job, arrived = received
                self.busy_since[stage] = time.monotonic()
                self.take(job, arrived)
                del self.busy_since[stage]
        except Exception:
            self.fail(stage)

    def take(self, job, arrived):
        if job.spent(arrived, time.monotonic()):
            self.report(messages.Dropped(job.job_id))
            return
        fault_injection.inject(job.texts)
        try:
            encoding = self.model.tokenizer.from_ids(job.texts, job.prompt) if job.token_ids else \
                self.model.tokenize(job.texts, job.is_tokenized, job.with_tokens, job.prompt, job.query)
        except Exception as error:  # the intake's checks should make this impossible; never die of it
            self.log.exception("could not tokenize job %d", job.job_id)
            self.report(messages.Refused(job.job_id, f"texts {job.offset} to {job.offset + len(job.texts) - 1} "
                                                     f"could not be tokenized: {error}", BAD_REQUEST))
            return
        if encoding.truncated and not job.truncate:
            index = min(encoding.truncated)
            self.report(messages.Refused(job.job_id, f"texts[{job.offset + index}] has more than "
                                                     f"{self.model.tokenizer.truncate_at} tokens, the "
                                                     "server's limit (max_seq_len); shorten it, allow "
                                                     "truncation, or embed it whole (long_texts=chunk)"))
            return
        self.metrics.count_truncated(len(encoding.truncated))
        with self.buffered:
            self.planner.add(Tokenized(job, encoding, arrived))
            self.buffered.notify()
            if job.priority and self.all_lanes_on_bulk():
                self.express_wake.notify()

    # ----- lanes: the model -----

    def compute(self, lane):
        """A lane's loop; `lane` is its name."""
        results = make_socket(zmq.Context.instance(), zmq.PUSH, connect=self.endpoints.results,
                              curve_client=self.endpoints.curve)
        try:
            while not self.stop.is_set():
                batch, kind, alone = self._next_pass(lane == EXPRESS)
                if batch is not None:
                    finished = batch.scatter(self.run_pass(lane, batch, kind, alone))
                    if finished:
                        send_frames(results, messages.Parts(tuple(map(self.part, finished))).frames(), copy=False)
        except Exception:
            self.fail(f"{lane} lane")
        finally:
            results.close(linger=LINGER_MS)

    def part(self, done):
        """A finished job's Part."""
        rows = fault_injection.garbled(self.finish(done), done.job.texts)
        return messages.Part(done.job.seq, done.job.job_id, done.job.offset, rows, self.tokens(done, rows),
                             done.encoding.num_tokens, len(done.encoding.truncated))

    def finish(self, done):
        """A finished job's rows as served: normalized as it asks, a reranker's scores, or a sparse
        model's SparseVectors."""
        if self.kind == "rerank":
            return self.model.finish(done.result(), done.job.raw_scores)
        if self.kind == "sparse":
            return self.model.finish(done.result(), done.job.normalize, done.job.top_k)
        return self.model.finish(done.result(), done.job.normalize)

    def tokens(self, done, rows):
        """The tokens a job asked for: its texts' own, or for a sparse model, each row's vocabulary
        entries, in the order of its indices."""
        if self.kind == "sparse" and done.job.with_tokens:
            return [self.model.decode_tokens(rows.row(i)[0]) for i in range(len(rows))]
        return done.encoding.tokens

    def run_pass(self, lane, batch, kind, alone):
        for wait in batch.start(time.monotonic()):
            self.metrics.observe("queue_seconds", wait)
        started = self.busy_since[lane] = time.monotonic()
        try:
            pooled = self.model.run(batch.inputs, alone=alone)
        finally:
            with self.buffered:
                self.running[kind] -= 1
        del self.busy_since[lane]
        self.metrics.record_pass(len(batch.rows), batch.inputs.real_tokens, batch.inputs.padded_tokens,
                                 time.monotonic() - started)
        return pooled

    def _next_pass(self, express=False):
        """(the next pass, its kind, whether it is alone), or (None, None, False) when there is none
        to run within IDLE_WAIT_S. A lane takes small requests' rows first, then bulk rows; the
        express lane takes small requests' rows, only while every other lane runs a bulk pass."""
        def ready_kind():
            if express:
                ready = self.all_lanes_on_bulk() and self.planner.ready(PRIORITY, self.batch_wait_s)
                return PRIORITY if ready else None
            return next((kind for kind in (PRIORITY, BULK) if self.planner.ready(kind, self.batch_wait_s)), None)

        wake = self.express_wake if express else self.buffered
        with self.buffered:
            # with a batch wait, wake up in time to run rows whose wait is over
            timeout = min(IDLE_WAIT_S, self.batch_wait_s or IDLE_WAIT_S)
            if not wake.wait_for(lambda: ready_kind() or self.stop.is_set(), timeout=timeout) or self.stop.is_set():
                return None, None, False
            kind = ready_kind()
            batch = self.planner.next_pass(kind)
            alone = not any(self.running.values()) and not self.planner and self.received.empty()
            self.running[kind] += 1
            if not express and ready_kind():
                self.buffered.notify()  # rows left for another lane
            if kind == BULK and self.all_lanes_on_bulk() and self.planner.has(PRIORITY):
                self.express_wake.notify()
            return batch, kind, alone

    def wake_on_stop(self):
        """Once `stop` is set, wake the threads that wait for work, so that none sleeps out IDLE_WAIT_S."""
        self.stop.wait()
        self.wake_intake()
        self.received.put(None)
        with self.buffered:
            self.buffered.notify_all()
            self.express_wake.notify_all()

    def close(self):
        """Close intake's wake-up pipe, once no thread of this worker runs (a thread still writing
        could reach whatever file next takes the number)."""
        for fd in self.intake_wake:
            os.close(fd)

    def all_lanes_on_bulk(self):
        """Whether every lane but the express lane runs a bulk pass (under `buffered`)."""
        return self.running[BULK] >= self.lanes

    def fail(self, stage):
        self.log.exception("%s failed; stopping this worker", stage)
        self.failed = True
        self.stop.set()


def worker_name(index):
    """The name of worker `index`'s process (in ps and top, the logs, and placement.layout)."""
    return f"worker-{index}"


def run_worker(settings, endpoints, index, remote=False, alone_on_host=False, started=None, cpus=None):
    """`started`: a pipe end on which to say None once the model is loaded, or why it could not be.
    `alone_on_host`: no other worker runs on this host, so this one knows when nothing else runs.
    `cpus`: the CPUs it runs on (None: any)."""
    name = f"{socket.gethostname()}/{worker_name(index)}" if remote else worker_name(index)
    log, stop = start_child(name, settings.verbose, cpus)
    try:
        lone_threads = lone_lane_threads() if alone_on_host else 0
        worker = Worker(settings, endpoints, f"{name}:{os.getpid()}", log, stop, remote, lone_threads)
    except Exception as error:
        _report_start(started, " ".join(f"{type(error).__name__}: {error}".split()))
        raise
    _report_start(started, None)
    lanes = [f"lane-{number}" for number in range(1, settings.lanes)] + [EXPRESS]
    prefetch = [f"prefetch-{number}" for number in range(settings.tokenizer_threads)]
    threads = [threading.Thread(target=worker.wake_on_stop, name="stop", daemon=True),
               threading.Thread(target=worker.intake, name="intake", daemon=True),
               *(threading.Thread(target=worker.prefetch, args=(stage,), name=stage, daemon=True)
                 for stage in prefetch),
               *(threading.Thread(target=worker.compute, args=(lane,), name=lane, daemon=True) for lane in lanes)]
    if settings.backend == "zero":
        log.warning("the zero backend runs no model: every row served is zero (it measures the server alone)")
    # said before intake says READY, so that the log has it once the ventilator counts this worker
    log.info("serving on %s with %s: %d lane(s) and the express lane, %d thread(s) per lane%s, %d tokenizing; "
             "model %s", settings.device, settings.backend, settings.lanes, settings.threads_per_worker,
             f", {lone_threads} for a pass alone" if worker.model.lone_backend else "", settings.tokenizer_threads,
             settings.name)
    for thread in threads:
        thread.start()
    try:
        worker.compute("lane-0")
    finally:
        stop.set()
        for thread in reversed(threads):
            thread.join(timeout=10)
        if not any(thread.is_alive() for thread in threads):  # else a socket or the pipe may still be in use
            let_queued_messages_out()
            worker.close()
    if worker.failed:
        raise SystemExit(1)
    log.info("stopped")


def _report_start(started, error):
    """Tell the WorkerPool that this worker serves (None) or why it cannot start (one line)."""
    if started is not None:
        started.send(error)
        started.close()
