"""The ventilator: takes client requests, registers them with the sink, deals jobs to workers.

Sockets: `frontend` (PULL, clients), `backend` (ROUTER, workers), a PUSH to the sink (sink_link.py),
`from_sink` (PULL: DONE for finished jobs, GONE for requests nobody listens for, UNREAD for
clients that do not read their results, BADPART for a worker's part the sink could not use),
plus a pipe from the supervisor that reports worker exits. Its logic lives in pure modules:
intake.py checks requests, scheduling.py queues and deals jobs, liveness.py says which workers
are alive, books.py counts what was done and answers SHOW_STATUS and SHOW_CONFIG, and messages.py
is what it says to the other processes. Requests past their deadline or abandoned by their client
are cancelled.

Request and job numbers start at random, so parts computed for an earlier run of the server (a
remote worker that outlived it) can never be taken for this run's.
"""
import contextlib
import secrets
import socket
import time
from dataclasses import asdict, replace

import zmq

from encoder_client.protocol import (BUSY, DRAINING, FORBIDDEN, NOT_FOUND, RESTARTED, TOO_LARGE, ProtocolError,
                                     decode_request, encode_data, encode_error)

from ..model.outputs import CALIBRATED, is_calibration
from ..processes import start_child
from ..security import curve_for, is_loopback, workers_use_curve
from . import messages
from .books import Books
from .intake import (check_result_size, long_texts, model_choices, model_index, output_of, parse_encode,
                     served_model)
from .liveness import HEARTBEAT_INTERVAL, Liveness
from .ownership import Owners
from .quiet_log import QuietLog
from .scheduling import Dispatcher
from .sink_link import SinkLink
from .sockets import NOBLOCK, POLL_MS, let_queued_messages_out, make_socket, peer_address, send_frames, user_id, waiting
from .windowing import Windowing


class Ventilator:
    def __init__(self, settings, addresses, log, supervisor=None):
        self.settings = settings
        self.models = settings.all_models  # the default model first
        self.log = log
        self.quiet = QuietLog(log)  # what peers cause: a flood of bad requests must not flood the log
        self.supervisor = supervisor  # a multiprocessing Connection, or None
        self.dispatcher = Dispatcher(settings.priority_batch_size, settings.max_batch_size,
                                     settings.prefetch_size, first_job_id=_random_start())
        self.liveness = Liveness(socket.gethostname())
        self.next_seq = _random_start()
        self.last_turn = time.monotonic()
        self.books = Books(settings)
        self.draining = False
        self.owners = Owners()  # under CURVE, the client key each identity belongs to
        self.windowing = Windowing(self.models)
        context = zmq.Context.instance()
        curve, self.authenticator = curve_for(context, settings)
        self.frontend = make_socket(context, zmq.PULL, bind=addresses.frontend, curve=curve,
                                    options={zmq.MAXMSGSIZE: settings.max_request_mb << 20})
        # ROUTER_HANDOVER: a worker that connects again under its name replaces its old connection
        self.backend = make_socket(context, zmq.ROUTER, bind=addresses.jobs_binds,
                                   curve=workers_use_curve(settings) and curve,
                                   options={zmq.ROUTER_MANDATORY: 1, zmq.ROUTER_HANDOVER: 1})
        self.from_sink = make_socket(context, zmq.PULL, bind=addresses.feedback)
        self.sink = SinkLink(make_socket(context, zmq.PUSH, connect=addresses.control))
        self.sink.send(messages.Reset().frames())  # a predecessor's requests held there are lost

    def run(self, stop):
        poller = zmq.Poller()
        for sock in (self.frontend, self.backend, self.from_sink, self.windowing.fileno()):
            poller.register(sock, zmq.POLLIN)
        if self.supervisor is not None:
            poller.register(self.supervisor.fileno(), zmq.POLLIN)
        drain_deadline = None
        while not (self.draining and self.dispatcher.in_flight_requests == 0 and not len(self.windowing)):
            if stop.is_set() and not self.draining:
                self.start_draining()
            if self.draining:
                drain_deadline = drain_deadline or time.monotonic() + self.settings.drain_timeout
                if time.monotonic() > drain_deadline:
                    self.log.warning("gave up waiting for %d in-flight requests",
                                     self.dispatcher.in_flight_requests)
                    break
            poller.register(self.frontend, 0 if self.sink.full else zmq.POLLIN)
            events = dict(poller.poll(POLL_MS))
            if self.from_sink in events:  # first: a request is scheduled knowing which workers are free
                for frames in waiting(self.from_sink):
                    self.on_feedback(frames)
            if self.frontend in events:
                for frames in waiting(self.frontend, copy=False):
                    self.on_client(frames)
            if self.backend in events:
                for frames in waiting(self.backend, copy=False):
                    self.on_worker(frames)
            if self.windowing.fileno() in events:
                self.on_windows()
            if self.supervisor is not None and self.supervisor.fileno() in events:
                self.on_supervisor(poller, stop)
            self.sink.send()
            self.keep_workers()
            for seq in self.dispatcher.expired(time.monotonic()):
                self.end_request(seq, "expired")
            self.dispatch()

    def close(self):
        self.windowing.close()
        if self.authenticator is not None:
            self.authenticator.stop()
        let_queued_messages_out()  # closes the sockets, once what they queue has gone out

    # ----- clients -----

    def on_client(self, frames):
        """Nothing a client sends ends this loop: a bad request gets an error reply when its identity
        is readable, and is logged and dropped otherwise."""
        raw = [frame.bytes for frame in frames]
        with self.replying_to(frames[0], raw=raw):
            request = decode_request(raw)
            if not self.owners.claim(request.identity, user_id(frames[0], self.authenticator is not None)):
                raise ProtocolError(f"identity {request.identity[:64]!r} belongs to another client key; dropped")
            self.on_request(request, frames[0])

    @contextlib.contextmanager
    def replying_to(self, first_frame, raw=None, request=None):
        """Turn what goes wrong with a request (its frames `raw`, or a parsed `request`: anything with
        its identity and req_id) into an error reply for its client; `first_frame` (None: not at
        hand) tells the log where it came from."""
        try:
            yield
        except ProtocolError as error:
            self.quiet.warning("bad request", "bad request from %s: %s", _peer(first_frame), error)
            if error.identity is not None:
                message = str(error) if error.code == NOT_FOUND else f"bad request: {error}"
                self.reply_error(error.identity, error.req_id, message, error.code)
        except Exception:  # a case the checks missed: that request fails, the server goes on
            self.log.exception("could not handle a request from %s", _peer(first_frame))
            request = request or decode_request(raw)
            self.reply_error(request.identity, request.req_id, "bad request: the server could not handle it")

    def on_request(self, request, first_frame):
        if request.command:
            self.on_command(request, first_frame)
        elif self.draining:
            self.reply_error(request.identity, request.req_id, "the server is shutting down", DRAINING)
        else:
            encode = parse_encode(request, self.settings.show_tokens_to_client, self.settings.max_pending_texts)
            index, model = served_model(encode, self.models)
            check_result_size(encode, model)
            handling = long_texts(encode, model)
            choices, output = model_choices(encode, model, handling), output_of(encode, model)
            if handling != "chunk":
                self.admit(encode, encode.texts, index, choices, output)
            elif self.windowing.surely_fit(index, encode.texts, choices["prompt"]):
                self.admit(encode, encode.texts, index, choices, replace(output, windows=[1] * len(encode.texts)))
            elif not self.windowing.submit(encode, index, choices, output):
                self.refuse_busy(encode, "server busy: too many long texts are being cut into windows; retry later")

    def on_windows(self):
        for (encode, index, choices, output, arrived), result in self.windowing.finished():
            with self.replying_to(None, request=encode):
                if isinstance(result, Exception):
                    raise ProtocolError(f"the texts could not be cut into windows: {result}", encode.identity,
                                        encode.req_id)
                encoding, windows = result
                if len(encoding) > self.settings.max_pending_texts:
                    raise ProtocolError(f"the texts make {len(encoding)} windows, above the server's limit of "
                                        f"{self.settings.max_pending_texts} (--max-pending-texts); split the request",
                                        encode.identity, encode.req_id, TOO_LARGE)
                weights = [len(ids) for ids in encoding.ids] if max(windows) > 1 else None
                self.admit(encode, encoding.ids, index, {**choices, "token_ids": True},
                           replace(output, windows=windows, weights=weights), arrived)

    def on_command(self, request, first_frame):
        if request.command == b"SHOW_CONFIG":
            self.sink.publish(encode_data(request.identity, request.req_id, self.books.config()))
        elif request.command == b"SHOW_STATUS":
            self.sink.publish(encode_data(request.identity, request.req_id,
                                          self.books.status(self.dispatcher, self.liveness, self.draining)))
        else:
            self.on_termination(request, peer_address(first_frame))

    def on_termination(self, request, peer):
        if not (is_loopback(peer) or self.settings.authorized_clients):
            self.quiet.warning("termination", "refused TERMINATION from non-loopback peer %s", peer)
            self.reply_error(request.identity, request.req_id,
                             "TERMINATION is accepted only from loopback or an authorized client key", FORBIDDEN)
            return
        self.log.info("TERMINATION received from %s", peer)
        self.sink.publish(encode_data(request.identity, request.req_id, {"terminating": True}))
        self.start_draining()

    def admit(self, request, rows, model, choices, output, arrived=None):
        """Queue `request`, as `rows` (its texts, or their windows), for the model of index `model`;
        its rows are finished as `output` (model.outputs.Output) says. Its timeout counts from when
        it `arrived` (None: now)."""
        if self.dispatcher.is_in_flight(request.identity, request.req_id):
            raise ProtocolError(f"req_id {request.req_id} is already in flight under this identity",
                                request.identity, request.req_id)
        pending, limit = self.dispatcher.pending_texts, self.settings.max_pending_texts
        if pending + len(rows) > limit:
            return self.refuse_busy(request, f"server busy: {pending} texts pending, the limit is {limit}; "
                                             "retry later")
        if output.precision in CALIBRATED:
            calibration = self.books.calibration.get(model)
            if calibration is None:
                return self.refuse_busy(request, f"server busy: no worker has calibrated {output.precision} for "
                                                 "this model yet; retry later")
            output = replace(output, ranges=calibration["normalized" if output.normalize else "raw"])
        if not output.plain:  # the sink finishes the rows: the worker leaves them as they are
            choices = {**choices, "normalize": False}
        seq = self.next_seq
        registration = messages.Registration(request.identity, request.req_id, len(rows), request.with_tokens,
                                             request.streamed, self.models[model].embedding_dim,
                                             None if output.plain else asdict(output),
                                             self.models[model].kind == "sparse")
        if self.sink.behind:  # the sink is not taking messages now
            return self.refuse_busy(request, "server busy: the result queue is full; retry later")
        self.sink.register(seq, registration)
        self.next_seq += 1
        self.dispatcher.submit(seq, request.identity, rows, arrived or time.monotonic(), request.timeout_s,
                               req_id=request.req_id, is_tokenized=request.is_tokenized,
                               with_tokens=request.with_tokens, model=model, **choices)
        self.log.debug("request %d: %d texts from %r", seq, len(request.texts), request.identity)

    def refuse_busy(self, request, message):
        self.books.counts["requests_busy"] += 1
        self.reply_error(request.identity, request.req_id, message, BUSY)

    def end_request(self, seq, outcome, error=None, code=None):
        """Stop a request early (expired, abandoned or failed): drop its queued jobs, and have the
        sink forget it and, with `error`, tell its client why."""
        skipped = self.dispatcher.cancel(seq)
        if skipped is None:
            return
        self.books.counts[f"requests_{outcome}"] += 1
        self.books.counts[f"texts_{outcome}"] += skipped
        self.log.info("request %d %s: %d texts never computed", seq, outcome, skipped)
        self.sink.send(messages.Forget(seq, error or "", code or "").frames())

    # ----- workers -----

    def on_worker(self, frames):
        """A message on the worker port. One that is no message of ours, or that the ventilator
        cannot handle, is logged and dropped, and its sender is no longer a worker of ours."""
        worker, now = frames[0].bytes, time.monotonic()
        if self.liveness.kept_out(worker, now):
            return
        name = worker.decode(errors="replace")
        message = messages.decode_or_log(frames[1:], self.log, name)
        try:
            if message is None:
                self.lose(self.liveness.misbehaved(worker, now))
            elif isinstance(message, messages.Ready):
                self.on_ready(worker, message, now, over_ipc=peer_address(frames[0]) is None)
            elif self.liveness.heard(worker, now):
                self.on_worker_report(worker, message)
            else:  # a worker of a ventilator before this one, or one given up for dead: it may join again
                self.ask_who(worker)
        except Exception:
            self.log.exception("could not handle a %s message from %s", type(message).__name__, name)
            self.lose(self.liveness.misbehaved(worker, now))

    def ask_who(self, worker):
        try:
            self.backend.send_multipart([worker, *messages.Who().frames()], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # gone already (EHOSTUNREACH), or it has connected anew: it says READY by itself

    def on_ready(self, worker, message, now, over_ipc):
        if message.protocol != messages.INTERNAL_PROTOCOL:
            self.log.warning("%s speaks version %s of the workers' protocol, this server %d: run the same release of "
                             "encoder-server on both hosts", worker.decode(errors="replace"), message.protocol,
                             messages.INTERNAL_PROTOCOL)
            self.lose(self.liveness.misbehaved(worker, now, "speaks another version of the workers' protocol"))
            return
        model = 0 if message.model is None else model_index(self.models, message.model)
        if model is None:
            self.log.warning("%s serves model %r, which this server does not", worker.decode(errors="replace"),
                             message.model[:100])
            self.lose(self.liveness.misbehaved(worker, now, "serves a model this server does not"))
            return
        self.lose(self.liveness.ready(worker, message, now, over_ipc))
        self.dispatcher.add_worker(worker, message.lanes, model, message.tokenizers, message.fast)
        calibration = self.books.calibration
        if model not in calibration and is_calibration(message.calibration, self.models[model].embedding_dim):
            calibration[model] = message.calibration
        self.log.info("%s ready (%d of %d), serving %s", worker.decode(errors="replace"), len(self.liveness),
                      self.books.workers_expected, self.models[model].name)

    def on_worker_report(self, worker, message):
        if isinstance(message, messages.Heartbeat):
            self.books.metrics.add(message.metrics)
        elif isinstance(message, messages.Dropped):
            job = self.dispatcher.job_dropped(message.number, worker)
            if job is not None:
                self.books.counts["texts_expired"] += len(job.texts)
                self.end_request(job.seq, "expired")
        elif isinstance(message, messages.Refused):
            job = self.dispatcher.job_dropped(message.job_id, worker)
            if job is not None:
                self.books.counts["texts_refused"] += len(job.texts)
                self.end_request(job.seq, "refused", message.error, message.code)
        else:
            raise messages.MessageError(f"a worker does not send {type(message).__name__}")

    def keep_workers(self):
        """Drop the workers that fell silent, and send the others their heartbeat when it is due."""
        now = time.monotonic()
        stalled = now - self.last_turn - POLL_MS / 1000  # beyond the longest poll: this loop was busy
        if stalled > HEARTBEAT_INTERVAL:
            self.log.warning("this loop stalled for %.1fs; workers' silence over that time does not count", stalled)
            self.liveness.stalled(stalled)
        self.last_turn = now
        self.lose(self.liveness.silent(now))
        for worker in self.liveness.beat_due(now):
            try:
                self.backend.send_multipart([worker, *messages.Heartbeat().frames()], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                self.lose(self.liveness.unreachable(worker))

    def on_supervisor(self, poller, stop):
        try:
            message = self.supervisor.recv()
        except EOFError:
            self.log.error("the supervisor is gone; stopping")
            poller.unregister(self.supervisor.fileno())
            self.supervisor = None
            stop.set()
            return
        if isinstance(message, messages.SinkRestarted):
            self.fail_in_flight()
        else:  # messages.WorkerExited: the supervisor restarts the worker
            self.lose(self.liveness.exited(message.pid, message.exitcode))

    def fail_in_flight(self):
        """The sink died with every request in flight: tell each client to resend its request."""
        lost = self.dispatcher.requests_in_flight()
        self.log.warning("the sink restarted: %d requests in flight fail; their clients may resend them", len(lost))
        for request in lost:
            self.end_request(request.seq, "failed")
            self.reply_error(request.client, request.req_id, messages.RESTART_ERROR, RESTARTED)
        self.dispatcher.release_assigned()

    def lose(self, losses):
        """Drop lost workers; their jobs go to others, and a job on its second dead worker fails its request."""
        for loss in losses:
            requeued, poisoned = self.dispatcher.remove_worker(loss.worker, loss.crashed)
            self.books.counts["jobs_redispatched"] += len(requeued)
            self.log.warning("%s %s; %d of its unfinished jobs go to other workers",
                             loss.worker.decode(errors="replace"), loss.why, len(requeued))
            if loss.kill and loss.pid is not None and self.supervisor is not None:
                self.supervisor.send(messages.WorkerSilent(loss.pid))
            for job in poisoned:
                last = job.offset + len(job.texts) - 1
                self.end_request(job.seq, "failed", f"texts {job.offset} to {last} of this request made a worker "
                                                    "crash twice, so the request was dropped; check those inputs")

    def on_feedback(self, frames):
        message = messages.decode_or_log(frames, self.log, "the sink")
        if isinstance(message, messages.Gone):
            self.end_request(message.number, "abandoned")
        elif isinstance(message, messages.Done):
            for job_id in message.job_ids:
                self.finish_job(job_id)
        elif isinstance(message, messages.Unread):
            self.abandon_unread(message)
        elif isinstance(message, messages.BadPart):
            self.on_bad_part(message)

    def abandon_unread(self, message):
        """The sink dropped replies for a client that left too much unread: drop its queued work too."""
        self.books.counts["replies_dropped"] += message.replies
        for seq in self.dispatcher.requests_of(message.identity):
            self.end_request(seq, "abandoned", UNREAD_ERROR, BUSY)

    def on_bad_part(self, message):
        """A part the sink could not use: its job goes to another worker, and its sender is given up
        (and kept out for a while). A part from the network that names a local worker's job is
        forged: a local worker sends over ipc."""
        worker = self.dispatcher.worker_of(message.job_id)
        if worker is None:
            return
        if message.remote and self.liveness.is_local(worker):
            self.quiet.warning("forged part", "a part from the network named job %d of local %s; ignored",
                               message.job_id, worker.decode(errors="replace"))
            return
        self.lose(self.liveness.misbehaved(worker, time.monotonic(), "sent a part the sink could not use"))

    def finish_job(self, job_id):
        request = self.dispatcher.job_done(job_id)
        if request is not None:
            self.books.counts["requests_served"] += 1
            self.books.metrics.observe("request_seconds", time.monotonic() - request.admitted)

    def dispatch(self):
        """Send each worker the jobs dealt to it, in one message."""
        dealt = {}
        for worker, job in self.dispatcher.assignments(time.monotonic()):
            dealt.setdefault(worker, []).append(job)
        for worker, jobs in dealt.items():
            try:
                send_frames(self.backend, [worker, *messages.Jobs(tuple(jobs)).frames()], NOBLOCK)
            except zmq.ZMQError:  # gone (EHOSTUNREACH) or full: either way, not a worker to count on
                self.lose(self.liveness.unreachable(worker))

    # ----- replies -----

    def start_draining(self):
        if not self.draining:
            self.draining = True
            self.log.info("draining: %d requests in flight", self.dispatcher.in_flight_requests)

    def reply_error(self, identity, req_id, message, code=None):
        self.sink.publish(encode_error(identity, req_id, message, code))


UNREAD_ERROR = ("abandoned: this client identity left too many results unread (--max-unread-mb), so its "
                "queued requests were dropped; read results as they arrive")


def _peer(first_frame):
    """Where a message came from, for the log."""
    return (peer_address(first_frame) if first_frame is not None else None) or "?"


def _random_start():
    return secrets.randbelow(2 ** 40) + 1


def run_ventilator(settings, addresses, supervisor=None, cpus=None):
    log, stop = start_child("ventilator", settings.verbose, cpus)
    ventilator = Ventilator(settings, addresses, log, supervisor)
    try:
        ventilator.run(stop)
    finally:
        ventilator.close()
    log.info("stopped")
