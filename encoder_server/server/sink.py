"""The sink: reassembles each request from its parts and publishes it under the client's topic.

Sockets: `collect` (PULL: parts from workers, local or remote), `control` (PULL, ipc only:
registrations and replies from the ventilator, which no peer on the worker port can forge),
`publish` (XPUB in manual mode, clients: it tells us who subscribes, and we apply whole topics
only, see subscriptions.py), `feedback` (PUSH to the ventilator: DONE for the jobs of the parts
that one turn of the loop took, GONE for a request nobody has listened for in ABANDON_AFTER
seconds, UNREAD for a client whose replies were dropped, BADPART for a part that could not be
used).

Publishing never blocks: a reply whose reader's queue is full waits in the backlog (XPUB_NODROP)
and is offered again; what the sink keeps for each client is capped in bytes (backlog.py), and a
client past it loses its further replies, each replaced by an error, and its queued work.
"""
import time

import zmq

from encoder_client.protocol import BUSY, CHUNK_BYTES, RESTARTED, encode_error, encode_refusal, result_messages
from encoder_client.sparse import SparseVectors

from ..processes import start_child
from ..security import curve_for, workers_use_curve
from . import messages
from .assembly import Assembler, PartError
from .backlog import Backlog, size_of
from .ownership import Owners
from .quiet_log import QuietLog
from .sockets import (NOBLOCK, POLL_MS, let_queued_messages_out, make_socket, peer_address, send_frames, user_id,
                      waiting)
from .subscriptions import Subscriptions, parse_change

ABANDON_AFTER = 15.0
CHECK_INTERVAL = 1.0
# one reply queued per subscriber, and one more being written: all that ZeroMQ holds for a client
# that does not read (the backlog counts both); a deeper queue would hold that many whole results
PUBLISH_HWM = 1
ROOM_POLL_MS = 2  # the longest wait for ZeroMQ's word of room while a reader is taking replies
ERROR_RESERVE = 1 << 20  # bytes of error replies an identity may have waiting beyond its budget
SLOW_AFTER = 1.0  # seconds a reader may take no reply while some wait before the log calls it slow
# seconds a stopping sink still offers held replies to their readers (the supervisor waits 10 s for it)
FLUSH_ON_STOP = 5.0


class Sink:
    def __init__(self, settings, addresses, log):
        self.log = log
        self.settings = settings
        # (rank, width) of the parts each served model's workers send
        self.shapes = {(3 if model.pooling.token_level else 2, model.embedding_dim)
                       for model in settings.all_models}
        self.assembler = Assembler()
        self.subscriptions = Subscriptions()
        unread_bytes = settings.max_unread_mb << 20
        self.backlog = Backlog(per_identity=unread_bytes, total=unread_bytes)
        # a reader a few chunks behind must never be past its budget for their size alone
        self.chunk_bytes = min(CHUNK_BYTES, unread_bytes // 8)
        self.owners = Owners()  # under CURVE, the client key each identity belongs to
        self.quiet = QuietLog(self.log)  # what peers cause: a flood must not flood the log
        self.flush_until = None  # once asked to stop: until when it still offers held replies
        context = zmq.Context.instance()
        curve, self.authenticator = curve_for(context, settings)
        self.collect = make_socket(context, zmq.PULL, bind=addresses.results_binds,
                                   curve=workers_use_curve(settings) and curve)
        self.control = make_socket(context, zmq.PULL, bind=addresses.control)
        # XPUB_VERBOSER: every subscribe and unsubscribe, not just the first; XPUB_MANUAL: we decide
        # (only SNDHWM: with a ZAP handler, an RCVHWM of 1 loses the subscriptions of CURVE clients)
        self.publish = make_socket(context, zmq.XPUB, bind=addresses.publish, curve=curve,
                                   options={zmq.SNDHWM: PUBLISH_HWM, zmq.XPUB_VERBOSER: 1, zmq.XPUB_NODROP: 1,
                                            zmq.XPUB_MANUAL: 1})
        self.feedback = make_socket(context, zmq.PUSH, connect=addresses.feedback)

    def run(self, stop):
        poller = zmq.Poller()
        for sock in (self.collect, self.control, self.publish):
            poller.register(sock, zmq.POLLIN)
        # the result socket's own file descriptor wakes the loop when ZeroMQ has news for it, such as
        # room in a reader's queue: then a reader that is taking replies gets its next one at once
        news = self.publish.getsockopt(zmq.FD)
        next_check = time.monotonic() + CHECK_INTERVAL
        while not self.may_stop(stop):
            poller.register(news, zmq.POLLIN if self.backlog.waits_for_room() else 0)
            events = dict(poller.poll(self.poll_ms()))
            if self.publish in events:
                for frames in waiting(self.publish, copy=False):
                    self.on_subscription(frames[0])
            if self.control in events:  # first: a request's registration before its parts
                for frames in waiting(self.control, copy=False):
                    self.on_message(frames, "the ventilator",
                                    (messages.Register, messages.Publish, messages.Forget, messages.Reset))
            if self.collect in events:
                self.on_parts(waiting(self.collect, copy=False))
            self.release()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_INTERVAL
                for seq in self.assembler.abandoned(self.subscriptions.is_listening, ABANDON_AFTER):
                    self.log.info("request %d: nobody has listened for it in %.0fs; giving it up", seq, ABANDON_AFTER)
                    self.feedback.send_multipart(messages.Gone(seq).frames())
                self.warn_of_slow_readers()

    def may_stop(self, stop):
        """Whether the loop may end: asked to stop, with no reply held for a reader that listens (the
        later chunks of a result: the ventilator, which has nothing in flight, stops at once), or
        FLUSH_ON_STOP after the request to stop."""
        if not stop.is_set():
            return False
        if self.flush_until is None:
            self.flush_until = time.monotonic() + FLUSH_ON_STOP
        return time.monotonic() > self.flush_until or not self.backlog.owes_any(self.subscriptions.is_listening)

    def poll_ms(self):
        """How long the loop may wait for a message: less when the backlog has replies to offer."""
        longest = ROOM_POLL_MS if self.backlog.waits_for_room() else POLL_MS
        due = self.backlog.next_due()
        return longest if due is None else max(0, min(longest, int((due - time.monotonic()) * 1000)))

    # ----- subscribers -----

    def on_subscription(self, frame):
        """Apply a subscription to one whole topic that, under CURVE, belongs to the subscriber's
        key; refuse it otherwise, telling a subscriber refused for another key's identity why."""
        message = frame.bytes
        change = parse_change(message)
        if change is None:
            if message[:1] == b"\x01":
                self.quiet.warning("refused", "refused a subscription to %r: only a client identity followed by a "
                                   "NUL byte, or a bert-serving-client UUID", message[1:40])
            return
        owned = self.owners.claim(change.identity, user_id(frame, self.authenticator is not None))
        if self.subscriptions.update(change, owned):
            self.publish.setsockopt(zmq.SUBSCRIBE if change.subscribe else zmq.UNSUBSCRIBE, change.topic)
            if change.subscribe:
                self.backlog.listening(change.identity)
            elif not self.subscriptions.is_listening(change.identity):
                self.backlog.unsubscribed(change.identity)
        elif change.subscribe and not owned:
            self.refuse(change.identity, "it belongs to another client key")

    def refuse(self, identity, why):
        """Tell the subscriber just refused why: its connection takes the refusal's topic (the
        identity's own subscribers, whose topic is a prefix of it, get the refusal too and ignore it)."""
        self.quiet.warning("not owned", "refused a subscription to %r: %s", identity[:64], why)
        refusal = encode_refusal(identity, why)
        self.publish.setsockopt(zmq.SUBSCRIBE, refusal[0])
        self.send(refusal)

    # ----- workers and the ventilator -----

    def on_parts(self, batch):
        """The workers' messages of parts that one turn took: one DONE for them all, sent before
        their requests' replies, so that the ventilator knows the workers are free before a client
        can send again."""
        done, completed = [], []
        for frames in batch:
            self.take_parts(frames, done, completed)
        if done:
            send_frames(self.feedback, messages.Done(tuple(done)).frames())
        for request in completed:
            self.publish_result(request)

    def take_parts(self, frames, done, completed):
        """A worker's parts: their job ids onto `done`, the requests they complete onto `completed`.
        One that cannot be used is dropped, and its job reported when its id can be read, so the
        ventilator gives the job to another worker and stops trusting this one."""
        try:
            message = messages.decode(frames)
        except messages.MessageError as error:
            self.on_bad_parts(messages.job_ids_in(frames), frames[0], error)
            return
        if not isinstance(message, messages.Parts):
            self.quiet.warning("not a part", "dropped a %s message from a worker, which it may not send",
                               type(message).__name__)
            return
        for part in message.parts:
            try:
                self.check_shape(part.array)
                completed.append(self.assembler.add_part(part.seq, part.offset, part.array, part.tokens,
                                                         part.num_tokens, part.truncated))
                done.append(part.job_id)
            except PartError as error:
                self.on_bad_parts([part.job_id], frames[0], error)

    def on_bad_parts(self, job_ids, first_frame, error):
        """Report the jobs of parts that could not be used; `first_frame` tells whether they came over
        the network (a part from the network that names a local worker's job is forged)."""
        remote = peer_address(first_frame) is not None
        self.quiet.warning("bad part", "dropped a message from a worker%s: %s",
                           f" (jobs {', '.join(map(str, job_ids[:8]))})" if job_ids else "", error)
        for job_id in job_ids:
            self.feedback.send_multipart(messages.BadPart(job_id, remote).frames())

    def check_shape(self, array):
        """PartError unless `array` holds rows of one of this server's models: [rows, dim], [rows,
        seq, dim], or sparse rows (the assembler checks the width of its request's model once it
        is registered)."""
        rank = 2 if isinstance(array, SparseVectors) else array.ndim
        if (rank, array.shape[-1] if rank else None) not in self.shapes:
            served = " or ".join(f"{width} values{' per token' if rank == 3 else ''}" for rank, width in self.shapes)
            raise PartError(f"a part of shape {list(array.shape)} is not rows of {served}")

    def on_message(self, frames, sender, expected):
        """A message from `sender`, which may send the `expected` kinds. Anything else, and what
        cannot be handled, is logged and dropped."""
        message = messages.decode_or_log(frames, self.log, sender)
        if message is not None and not isinstance(message, expected):
            self.log.warning("dropped a %s message from %s, which it may not send", type(message).__name__, sender)
            return
        try:
            self.handle(message)
        except Exception:
            self.log.exception("dropped a %s message that could not be handled", type(message).__name__)

    def handle(self, message):
        if isinstance(message, messages.Register):
            for seq, registration in message.registrations.items():
                self.publish_result(self.assembler.register(seq, registration))
        elif isinstance(message, messages.Publish):
            self.deliver(message.identity, message.reply, ERROR_RESERVE)
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
                                                             messages.RESTART_ERROR, RESTARTED), ERROR_RESERVE)

    def forget(self, message):
        registration = self.assembler.forget(message.seq)
        if registration is not None and message.error:
            self.deliver(registration.identity, encode_error(registration.identity, registration.req_id,
                                                             message.error, message.code or None), ERROR_RESERVE)

    # ----- replies -----

    def publish_result(self, completed):
        if completed is not None:
            for frames in result_messages(completed.identity, completed.req_id, completed.array, completed.tokens,
                                          completed.num_tokens, completed.truncated, completed.streamed,
                                          completed.windows, self.chunk_bytes):
                if not self.deliver(completed.identity, frames):
                    return  # its other chunks would be of no use

    def deliver(self, identity, frames, reserve=0):
        """Publish now when a subscriber has room and no older reply waits; otherwise keep it in
        the backlog. False when it was dropped instead: its client has too much unread."""
        listening = self.subscriptions.is_listening(identity)
        if listening and not self.backlog.owes(identity) and self.send(frames):
            self.backlog.published(identity, size_of(frames))
            return True
        dropped = self.backlog.hold(identity, frames, slow=listening, reserve=reserve)
        kept = not dropped or dropped[-1].frames is not frames
        evicted, refused = (dropped, []) if kept else (dropped[:-1], dropped[-1:])
        self.on_dropped(evicted, "it held the most when all clients' waiting replies reached the cap")
        self.on_dropped(refused, "it has too many bytes unread")
        return kept

    def warn_of_slow_readers(self):
        """Say in the log that a listening reader is not keeping up, once it has taken no reply
        for SLOW_AFTER while some wait (checked on a timer: its replies may all have come before)."""
        slow = [identity for identity in self.backlog.stalled(SLOW_AFTER) if self.subscriptions.is_listening(identity)]
        if slow:
            self.quiet.warning("slow", "the reader of %r is not keeping up; holding its replies", slow[0][:64])

    def release(self):
        """Offer the backlog's replies again, and let go of those that waited too long."""
        expired = self.backlog.release(lambda held: self.send(held.frames), self.subscriptions.is_listening)
        self.on_dropped([held for held in expired if held.slow], "its reader took none for %.0fs"
                        % self.backlog.slow_seconds)

    def on_dropped(self, dropped, why):
        """Replies the backlog let go of: their clients' queued work is abandoned, and a dropped
        result is replaced by an error that says why (if that fits the reserve)."""
        for identity in dict.fromkeys(held.identity for held in dropped):
            lost = [held for held in dropped if held.identity == identity]
            self.quiet.warning("dropped", "dropped %d replies for %r: %s (at most %d MB, --max-unread-mb)",
                               len(lost), identity[:64], why, self.settings.max_unread_mb)
            self.feedback.send_multipart(messages.Unread(identity, len(lost)).frames())
            for req_id in dict.fromkeys(int(bytes(held.frames[-1])) for held in lost if not held.reserve):
                self.deliver(identity, encode_error(identity, req_id, UNREAD_ERROR % (
                    why, self.settings.max_unread_mb), BUSY), ERROR_RESERVE)

    def send(self, frames):
        """Publish without waiting; False when a subscriber of its topic has no room (XPUB_NODROP)."""
        try:
            send_frames(self.publish, frames, NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def close(self):
        if self.authenticator is not None:
            self.authenticator.stop()
        let_queued_messages_out()  # closes the sockets, once what they queue has gone out


UNREAD_ERROR = ("the server dropped this result: this client identity did not read its results (%s; the server "
                "keeps at most %d MB unread per identity, --max-unread-mb); read results as they arrive")


def run_sink(settings, addresses, cpus=None):
    log, stop = start_child("sink", settings.verbose, cpus)
    sink = Sink(settings, addresses, log)
    try:
        sink.run(stop)
    finally:
        sink.close()
    log.info("stopped")
