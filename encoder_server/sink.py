"""The sink: reassembles each request from its parts and publishes it under the client's identity.

Sockets: `collect` (PULL: parts from workers, local or remote, registrations and replies from the
ventilator),
`publish` (XPUB, clients: it also tells us who subscribes), `feedback` (PUSH to the ventilator:
one DONE per finished job, GONE for a request nobody has listened for in ABANDON_AFTER seconds).

Publishing never blocks and never drops silently: a reply whose reader's queue is full is held
and tried again (XPUB_NODROP), and given up only after the reader stayed stuck for a long while.
"""
import time

import zmq

from encoder_client.protocol import encode_error, encode_result

from . import messages
from .assembly import Assembler
from .runtime import POLL_MS, make_socket, start_child
from .security import curve_for, workers_use_curve
from .subscriptions import Subscriptions

ABANDON_AFTER = 15.0
CHECK_INTERVAL = 1.0
PUBLISH_HWM = 1000  # replies queued per subscriber


class Sink:
    def __init__(self, settings, addresses, log):
        self.log = log
        self.assembler = Assembler()
        self.subscriptions = Subscriptions()
        self.quiet_until = 0.0  # rate limit for the slow-reader warning
        context = zmq.Context.instance()
        curve, self.authenticator = curve_for(context, settings)
        self.collect = make_socket(context, zmq.PULL, bind=addresses.results_binds,
                                   curve=workers_use_curve(settings) and curve)
        # XPUB_VERBOSER: every subscribe and unsubscribe, not just the first
        self.publish = make_socket(context, zmq.XPUB, bind=addresses.publish, hwm=PUBLISH_HWM, curve=curve,
                                   options={zmq.XPUB_VERBOSER: 1, zmq.XPUB_NODROP: 1})
        self.feedback = make_socket(context, zmq.PUSH, connect=addresses.feedback)

    def run(self, stop):
        poller = zmq.Poller()
        poller.register(self.collect, zmq.POLLIN)
        poller.register(self.publish, zmq.POLLIN)
        next_check = time.monotonic() + CHECK_INTERVAL
        while not stop.is_set():
            events = dict(poller.poll(POLL_MS))
            if self.publish in events:
                self.subscriptions.update(self.publish.recv())
            if self.collect in events:
                self.on_message(self.collect.recv_multipart(copy=False))
            for held in self.subscriptions.releasable():
                if self.subscriptions.is_listening(held.identity):
                    self.deliver(held.identity, held.frames, held)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_INTERVAL
                for seq in self.assembler.abandoned(self.subscriptions.is_listening, ABANDON_AFTER):
                    self.log.info("request %d: nobody has listened for it in %.0fs; giving it up", seq, ABANDON_AFTER)
                    self.feedback.send_multipart(messages.Gone(seq).frames())

    def on_message(self, frames):
        message = messages.decode_or_log(frames, self.log, "a worker or the ventilator")
        if isinstance(message, messages.Part):
            self.publish_result(self.assembler.add_part(message.seq, message.offset, message.array, message.tokens,
                                                        message.num_tokens, message.truncated))
            self.feedback.send_multipart(messages.Done(message.job_id).frames())
        elif isinstance(message, messages.Register):
            self.publish_result(self.assembler.register(message.seq, message.registration))
        elif isinstance(message, messages.Publish):
            self.deliver(message.identity, message.reply)
        elif isinstance(message, messages.Forget):
            self.forget(message)

    def forget(self, message):
        registration = self.assembler.forget(message.seq)
        if registration is not None and message.error:
            self.deliver(registration.identity, encode_error(registration.identity, registration.req_id,
                                                             message.error, message.code or None))

    def publish_result(self, completed):
        if completed is not None:
            self.deliver(completed.identity, encode_result(completed.identity, completed.req_id, completed.array,
                                                           completed.tokens, completed.num_tokens, completed.truncated))

    def deliver(self, identity, frames, held=None):
        """Publish now if someone listens and has room; otherwise hold the reply for later."""
        if not self.subscriptions.is_listening(identity):
            self.subscriptions.hold(identity, frames)
            return
        try:
            self.publish.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:  # a reader's queue is full
            if held is None or not held.slow:
                self.subscriptions.hold(identity, frames, slow=True)
                if time.monotonic() > self.quiet_until:
                    self.quiet_until = time.monotonic() + 10
                    self.log.warning("the reader of %r is not keeping up; holding its replies", identity)
            elif time.monotonic() < held.deadline:
                self.subscriptions.keep(held)
            else:
                self.log.error("dropped a reply for %r: its reader has not read for %.0fs", identity,
                               self.subscriptions.slow_seconds)

    def close(self):
        for sock in (self.collect, self.publish, self.feedback):
            sock.close(linger=1000)
        if self.authenticator is not None:
            self.authenticator.stop()


def run_sink(settings, addresses):
    log, stop = start_child("sink", settings.verbose)
    sink = Sink(settings, addresses, log)
    try:
        sink.run(stop)
    finally:
        sink.close()
    log.info("stopped")
