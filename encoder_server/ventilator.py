"""The ventilator: takes client requests, registers them with the sink, deals jobs to workers.

Sockets: `frontend` (PULL, clients), `backend` (ROUTER, workers), `to_sink` (PUSH),
`from_sink` (PULL, one DONE per finished job).
"""
import time

import zmq

from encoder_client.protocol import PROTOCOL_VERSION, ProtocolError, decode_request, encode_data, encode_error

from . import __version__, messages
from .assembly import Registration
from .intake import is_loopback, parse_encode
from .runtime import POLL_MS, make_socket, start_child
from .scheduling import Dispatcher


class Ventilator:
    def __init__(self, settings, addresses, log):
        self.settings = settings
        self.log = log
        self.dispatcher = Dispatcher(settings.priority_batch_size, settings.max_batch_size,
                                     settings.prefetch_size)
        self.next_seq = 1
        self.started = time.monotonic()
        self.requests_served = 0
        self.draining = False
        context = zmq.Context.instance()
        self.frontend = make_socket(context, zmq.PULL, bind=addresses.frontend)
        self.backend = make_socket(context, zmq.ROUTER, bind=addresses.backend)
        self.from_sink = make_socket(context, zmq.PULL, bind=addresses.feedback)
        self.to_sink = make_socket(context, zmq.PUSH, connect=addresses.sink)

    def run(self, stop):
        poller = zmq.Poller()
        for sock in (self.frontend, self.backend, self.from_sink):
            poller.register(sock, zmq.POLLIN)
        drain_deadline = None
        while not (self.draining and self.dispatcher.in_flight_requests == 0):
            if stop.is_set() and not self.draining:
                self.start_draining()
            if self.draining:
                drain_deadline = drain_deadline or time.monotonic() + self.settings.graceful_timeout
                if time.monotonic() > drain_deadline:
                    self.log.warning("gave up waiting for %d in-flight requests",
                                     self.dispatcher.in_flight_requests)
                    break
            events = dict(poller.poll(POLL_MS))
            if self.frontend in events:
                self.on_client(self.frontend.recv_multipart(copy=False))
            if self.backend in events:
                self.on_worker(self.backend.recv_multipart())
            if self.from_sink in events:
                self.on_done(self.from_sink.recv_multipart())
            self.dispatch()

    def close(self):
        for sock in (self.frontend, self.backend, self.from_sink, self.to_sink):
            sock.close(linger=1000)

    # ----- events -----

    def on_client(self, frames):
        peer = _peer_address(frames[0])
        raw = [frame.bytes for frame in frames]
        try:
            request = decode_request(raw)
            if request.command:
                self.on_command(request, peer)
            elif self.draining:
                self.reply_error(request.identity, request.req_id, "the server is shutting down")
            else:
                self.admit(parse_encode(request, self.settings.show_tokens_to_client))
        except ProtocolError as error:
            self.log.warning("bad request from %s: %s", peer or "?", error)
            if error.identity is not None:
                self.reply_error(error.identity, error.req_id, f"bad request: {error}")

    def on_command(self, request, peer):
        if request.command == b"SHOW_CONFIG":
            self.publish(encode_data(request.identity, request.req_id, self.config()))
        elif request.command == b"SHOW_STATUS":
            self.publish(encode_data(request.identity, request.req_id, self.status()))
        elif not is_loopback(peer):
            self.log.warning("refused TERMINATION from non-loopback peer %s", peer)
            self.reply_error(request.identity, request.req_id, "TERMINATION is accepted only from loopback")
        else:
            self.log.info("TERMINATION received from %s", peer)
            self.publish(encode_data(request.identity, request.req_id, {"terminating": True}))
            self.start_draining()

    def admit(self, request):
        seq = self.next_seq
        self.next_seq += 1
        registration = Registration(request.identity, request.req_id, len(request.texts), request.with_tokens)
        self.to_sink.send_multipart(messages.register_frames(seq, registration))
        self.dispatcher.submit(seq, request.identity, request.texts, is_tokenized=request.is_tokenized,
                               with_tokens=request.with_tokens)
        self.log.debug("request %d: %d texts from %r", seq, len(request.texts), request.identity)

    def on_worker(self, frames):
        worker, kind = frames[0], frames[1]
        if kind == messages.READY:
            self.dispatcher.add_worker(worker)
            self.log.info("%s ready (%d of %d)", worker.decode(errors="replace"),
                          len(self.dispatcher.workers), self.settings.num_worker)

    def on_done(self, frames):
        if self.dispatcher.job_done(int(frames[1])) is not None:
            self.requests_served += 1

    def dispatch(self):
        for worker, job in self.dispatcher.assignments():
            self.backend.send_multipart([worker, *messages.job_frames(job)])

    # ----- replies -----

    def start_draining(self):
        if not self.draining:
            self.draining = True
            self.log.info("draining: %d requests in flight", self.dispatcher.in_flight_requests)

    def publish(self, frames):
        self.to_sink.send_multipart([messages.PUBLISH, *frames])

    def reply_error(self, identity, req_id, message):
        self.publish(encode_error(identity, req_id, message))

    def config(self):
        return {**self.settings.public_config(), "server_version": __version__,
                "protocol_version": PROTOCOL_VERSION}

    def status(self):
        workers = self.dispatcher.workers
        return {
            "ready": len(workers) >= self.settings.num_worker and not self.draining,
            "workers_alive": len(workers),
            "workers_expected": self.settings.num_worker,
            "worker_busy_texts": workers,
            "queue_depth": self.dispatcher.queue_depths(),
            "in_flight_requests": self.dispatcher.in_flight_requests,
            "requests_served": self.requests_served,
            "draining": self.draining,
            "uptime_s": round(time.monotonic() - self.started, 3),
            "server_version": __version__,
        }


def _peer_address(frame):
    try:
        return frame.get("Peer-Address")
    except zmq.ZMQError:
        return None


def run_ventilator(settings, addresses):
    log, stop = start_child("ventilator", settings.verbose)
    ventilator = Ventilator(settings, addresses, log)
    try:
        ventilator.run(stop)
    finally:
        ventilator.close()
    log.info("stopped")
