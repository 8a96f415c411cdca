"""The sink: reassembles each request from its parts and publishes it under the client's identity.

Sockets: `collect` (PULL: parts from workers, local or remote), `control` (PULL, ipc only:
registrations and replies from the ventilator, which no peer on the worker port can forge),
`publish` (XPUB in manual mode, clients: it tells us who subscribes, and we accept exact client
identities only), `feedback` (PUSH to the ventilator: one DONE per finished job, GONE for a
request nobody has listened for in ABANDON_AFTER seconds).

Publishing never blocks and never drops silently: a reply whose reader's queue is full is held
and tried again (XPUB_NODROP), and given up only after the reader stayed stuck for a long while.
"""
import time

import zmq

from encoder_client.protocol import RESTARTED, encode_error, result_messages

from . import messages
from .assembly import Assembler
from .ownership import Owners
from .runtime import POLL_MS, make_socket, peer_address, start_child, user_id
from .security import curve_for, workers_use_curve
from .subscriptions import Subscriptions, topic_change

ABANDON_AFTER = 15.0
CHECK_INTERVAL = 1.0
PUBLISH_HWM = 1000  # replies queued per subscriber
WARN_EVERY = 10


class Sink:
    def __init__(self, settings, addresses, log):
        self.log = log
        self.assembler = Assembler()
        self.subscriptions = Subscriptions()
        self.owners = Owners()  # under CURVE, the client key each identity belongs to
        self.quiet_until = {}  # warning kind -> when it may be logged again (a flood must not flood the log)
        context = zmq.Context.instance()
        curve, self.authenticator = curve_for(context, settings)
        self.collect = make_socket(context, zmq.PULL, bind=addresses.results_binds,
                                   curve=workers_use_curve(settings) and curve)
        self.control = make_socket(context, zmq.PULL, bind=addresses.control)
        # XPUB_VERBOSER: every subscribe and unsubscribe, not just the first; XPUB_MANUAL: we decide
        self.publish = make_socket(context, zmq.XPUB, bind=addresses.publish, hwm=PUBLISH_HWM, curve=curve,
                                   options={zmq.XPUB_VERBOSER: 1, zmq.XPUB_NODROP: 1, zmq.XPUB_MANUAL: 1})
        self.feedback = make_socket(context, zmq.PUSH, connect=addresses.feedback)

    def run(self, stop):
        poller = zmq.Poller()
        for sock in (self.collect, self.control, self.publish):
            poller.register(sock, zmq.POLLIN)
        next_check = time.monotonic() + CHECK_INTERVAL
        while not stop.is_set():
            events = dict(poller.poll(POLL_MS))
            if self.publish in events:
                self.on_subscription(self.publish.recv(copy=False))
            if self.collect in events:
                self.on_message(self.collect.recv_multipart(copy=False), "a worker", (messages.Part,))
            if self.control in events:
                self.on_message(self.control.recv_multipart(copy=False), "the ventilator",
                                (messages.Register, messages.Publish, messages.Forget, messages.Reset))
            for held in self.subscriptions.release(lambda held: self.send(held.identity, held.frames)):
                if self.subscriptions.is_listening(held.identity) and not self.send(held.identity, held.frames):
                    self.log.error("dropped a reply for %r: its reader did not read it within %.0fs", held.identity,
                                   self.subscriptions.slow_seconds if held.slow else self.subscriptions.hold_seconds)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_INTERVAL
                for seq in self.assembler.abandoned(self.subscriptions.is_listening, ABANDON_AFTER):
                    self.log.info("request %d: nobody has listened for it in %.0fs; giving it up", seq, ABANDON_AFTER)
                    self.feedback.send_multipart(messages.Gone(seq).frames())

    def on_subscription(self, frame):
        """Apply a subscription when it is to one exact identity (see subscriptions.py) that, under
        CURVE, belongs to the subscriber's key; refuse it otherwise."""
        message = frame.bytes
        change = topic_change(message)
        key = user_id(frame)
        change = self.subscriptions.update(message, change is None or self.owners.claim(change[1], key),
                                           key or peer_address(frame))
        if change is None:
            if message[:1] == b"\x01" and self.may_warn("refused"):
                self.log.warning("refused a subscription to %r: only exact client identities, each to its own key, "
                                 "at most %d per peer (one such line per %ds)", message[1:33],
                                 self.subscriptions.max_topics_per_peer, WARN_EVERY)
            return
        subscribe, topic = change
        self.publish.setsockopt(zmq.SUBSCRIBE if subscribe else zmq.UNSUBSCRIBE, topic)

    def on_message(self, frames, sender, expected):
        """A message from `sender`, which may send the `expected` kinds. Anything else, and what
        cannot be handled, is logged and dropped: nothing on the worker port ends this loop."""
        message = messages.decode_or_log(frames, self.log, sender)
        if message is not None and not isinstance(message, expected):
            self.log.warning("dropped a %s message from %s, which it may not send", type(message).__name__, sender)
            return
        try:
            self.handle(message)
        except Exception:
            self.log.exception("dropped a %s message that could not be handled", type(message).__name__)

    def handle(self, message):
        if isinstance(message, messages.Part):
            # DONE first: the ventilator then knows the worker is free before the client can send again
            self.feedback.send_multipart(messages.Done(message.job_id).frames())
            self.publish_result(self.assembler.add_part(message.seq, message.offset, message.array, message.tokens,
                                                        message.num_tokens, message.truncated))
        elif isinstance(message, messages.Register):
            self.publish_result(self.assembler.register(message.seq, message.registration))
        elif isinstance(message, messages.Publish):
            self.deliver(message.identity, message.reply)
        elif isinstance(message, messages.Forget):
            self.forget(message)
        elif isinstance(message, messages.Reset):
            self.reset()

    def reset(self):
        registrations = self.assembler.reset()
        if registrations:
            self.log.warning("the ventilator restarted: %d requests in flight fail; their clients may resend them",
                             len(registrations))
        for registration in registrations:
            self.deliver(registration.identity, encode_error(registration.identity, registration.req_id,
                                                             messages.RESTART_ERROR, RESTARTED))

    def forget(self, message):
        registration = self.assembler.forget(message.seq)
        if registration is not None and message.error:
            self.deliver(registration.identity, encode_error(registration.identity, registration.req_id,
                                                             message.error, message.code or None))

    def publish_result(self, completed):
        if completed is not None:
            for frames in result_messages(completed.identity, completed.req_id, completed.array, completed.tokens,
                                          completed.num_tokens, completed.truncated, completed.streamed):
                self.deliver(completed.identity, frames)

    def deliver(self, identity, frames):
        """Publish now if someone listens and has room; otherwise hold the reply for later."""
        if not self.subscriptions.is_listening(identity):
            self.subscriptions.hold(identity, frames)
        elif not self.send(identity, frames):
            self.subscriptions.hold(identity, frames, slow=True)
            if self.may_warn("slow"):
                self.log.warning("the reader of %r is not keeping up; holding its replies", identity)

    def send(self, identity, frames):
        """Publish without waiting; False when a reader of `identity` has no room (XPUB_NODROP)."""
        try:
            self.publish.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def may_warn(self, kind):
        """True at most once per WARN_EVERY seconds for each kind of warning."""
        now = time.monotonic()
        if now < self.quiet_until.get(kind, 0.0):
            return False
        self.quiet_until[kind] = now + WARN_EVERY
        return True

    def close(self):
        for sock in (self.collect, self.control, self.publish, self.feedback):
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
