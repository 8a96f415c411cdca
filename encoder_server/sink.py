"""The sink: reassembles each request from its parts and publishes it under the client's identity.

Sockets: `collect` (PULL: parts from workers, registrations and replies from the ventilator),
`publish` (XPUB, clients: it also tells us who subscribes), `feedback` (PUSH: one DONE per
finished job, to the ventilator).
"""
import zmq

from encoder_client.protocol import encode_result

from . import messages
from .assembly import Assembler
from .runtime import POLL_MS, make_socket, start_child
from .subscriptions import Subscriptions


class Sink:
    def __init__(self, addresses, log):
        self.log = log
        self.assembler = Assembler()
        self.subscriptions = Subscriptions()
        context = zmq.Context.instance()
        self.collect = make_socket(context, zmq.PULL, bind=addresses.sink)
        self.publish = make_socket(context, zmq.XPUB, bind=addresses.publish)
        self.publish.setsockopt(zmq.XPUB_VERBOSER, 1)  # every subscribe and unsubscribe, not just the first
        self.feedback = make_socket(context, zmq.PUSH, connect=addresses.feedback)

    def run(self, stop):
        poller = zmq.Poller()
        poller.register(self.collect, zmq.POLLIN)
        poller.register(self.publish, zmq.POLLIN)
        while not stop.is_set():
            events = dict(poller.poll(POLL_MS))
            if self.publish in events:
                self.subscriptions.update(self.publish.recv())
            if self.collect in events:
                self.on_message(self.collect.recv_multipart(copy=False))
            for frames in self.subscriptions.releasable():
                self.publish.send_multipart(frames, copy=False)

    def on_message(self, frames):
        kind = frames[0].bytes
        if kind == messages.PART:
            header, array = messages.decode_part(frames[1].bytes, frames[2].buffer)
            self.publish_result(self.assembler.add_part(header["seq"], header["offset"], array, header["tokens"]))
            self.feedback.send_multipart(messages.done_frames(header["job_id"]))
        elif kind == messages.REGISTER:
            self.publish_result(self.assembler.register(*messages.decode_register([frame.bytes for frame in frames])))
        elif kind == messages.PUBLISH:
            self.deliver(frames[1].bytes, frames[1:])

    def publish_result(self, completed):
        if completed is not None:
            self.deliver(completed.identity, encode_result(completed.identity, completed.req_id, completed.array,
                                                           completed.tokens))

    def deliver(self, identity, frames):
        if self.subscriptions.is_listening(identity):
            self.publish.send_multipart(frames, copy=False)
        else:
            self.subscriptions.hold(identity, frames)

    def close(self):
        for sock in (self.collect, self.publish, self.feedback):
            sock.close(linger=1000)


def run_sink(settings, addresses):
    log, stop = start_child("sink", settings.verbose)
    sink = Sink(addresses, log)
    try:
        sink.run(stop)
    finally:
        sink.close()
    log.info("stopped")
