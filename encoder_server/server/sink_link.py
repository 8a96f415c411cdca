"""The ventilator's messages to the sink, in order and never dropped.

Each turn of the ventilator's loop registers the requests it admitted in one REGISTER message,
sent before anything else the turn has for the sink (the replies the ventilator makes itself, a
request's FORGET), so that the sink knows every request before its first part or word about it.
A sink that is restarting, or has fallen behind, takes nothing for a while: the messages wait
here, in order. Past `limit` waiting messages the link is `full`, and the ventilator stops reading
requests until the sink catches up: a client's send then waits, where a dropped message would
have cost it its only reply.
"""
from collections import deque

import zmq

from . import messages
from .sockets import NOBLOCK, send_frames

LIMIT = 10_000


class SinkLink:
    def __init__(self, sock, limit=LIMIT):
        self.sock = sock  # PUSH to the sink's control socket
        self.limit = limit
        self.unsent = deque()  # messages the sink could not take yet
        self.registering = {}  # seq -> Registration of the requests admitted since the last send

    @property
    def behind(self):
        """Whether messages are waiting for the sink."""
        return bool(self.unsent)

    @property
    def full(self):
        return len(self.unsent) >= self.limit

    def register(self, seq, registration):
        self.registering[seq] = registration

    def send(self, frames=None):
        """Send `frames` (None: nothing more) after the registrations made since the last call, or
        keep them, in order, behind those the sink has not taken."""
        if self.registering:
            self.unsent.append(messages.Register(self.registering).frames())
            self.registering = {}
        if frames is not None:
            self.unsent.append(frames)
        try:
            while self.unsent:
                send_frames(self.sock, self.unsent[0], NOBLOCK)
                self.unsent.popleft()
        except zmq.Again:
            pass

    def publish(self, frames):
        """Have the sink publish a reply the ventilator made (an error, SHOW_CONFIG, SHOW_STATUS)."""
        self.send(messages.Publish(frames).frames())
