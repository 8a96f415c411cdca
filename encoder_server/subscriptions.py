"""Who is subscribed on the sink's XPUB socket, and the replies that cannot be published yet.

A client's SUB subscription reaches the sink some milliseconds after it connects (ZeroMQ's
"slow joiner"); a reply published before then is lost. bert-serving-client sends SHOW_CONFIG the
moment it connects, so the sink holds replies for identities nobody subscribes to yet, for up to
`hold_seconds`, and publishes them once a matching subscription arrives. A reply whose reader's
queue is full is held too, for `slow_seconds`, and tried again. Held replies are capped in bytes;
the oldest go first.
"""
import time
from collections import Counter, deque
from dataclasses import dataclass


@dataclass
class Held:
    deadline: float
    identity: bytes
    frames: list
    size: int
    slow: bool = False  # held because the reader's queue was full, not because nobody listened


class Subscriptions:
    def __init__(self, hold_seconds=5.0, slow_seconds=30.0, max_held_bytes=256 << 20):
        self.hold_seconds = hold_seconds
        self.slow_seconds = slow_seconds
        self.max_held_bytes = max_held_bytes
        self.evicted = 0
        self._topics = Counter()
        self._held = deque()
        self._held_bytes = 0

    def update(self, message):
        """Apply one XPUB subscription message: b'\\x01topic' subscribes, b'\\x00topic' unsubscribes."""
        if not message:
            return
        topic = bytes(message[1:])
        if message[0] == 1:
            self._topics[topic] += 1
        elif message[0] == 0 and self._topics[topic] > 0:
            self._topics[topic] -= 1
            if not self._topics[topic]:
                del self._topics[topic]

    def is_listening(self, identity):
        return any(identity.startswith(topic) for topic in self._topics)

    def hold(self, identity, frames, now=None, slow=False):
        """Keep a reply for later: until its reader listens (or for slow_seconds when `slow`)."""
        now = now or time.monotonic()
        self.keep(Held(now + (self.slow_seconds if slow else self.hold_seconds), identity, frames,
                       sum(len(frame) for frame in frames), slow))

    def keep(self, held):
        """Hold a reply again, keeping its deadline."""
        self._held.append(held)
        self._held_bytes += held.size
        while self._held_bytes > self.max_held_bytes and len(self._held) > 1:
            self._held_bytes -= self._held.popleft().size
            self.evicted += 1

    def releasable(self, now=None):
        """Held replies whose reader now listens, or whose wait has run out, in arrival order."""
        if not self._held:
            return []
        now = now or time.monotonic()
        ready, waiting = [], deque()
        for held in self._held:
            (ready if now >= held.deadline or self.is_listening(held.identity) else waiting).append(held)
        self._held = waiting
        self._held_bytes -= sum(held.size for held in ready)
        return ready
