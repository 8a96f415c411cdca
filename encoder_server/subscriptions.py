"""Who is subscribed on the sink's XPUB socket, so a reply is not published before its reader listens.

A client's SUB subscription reaches the sink some milliseconds after it connects (ZeroMQ's
"slow joiner"); a reply published before then is lost. bert-serving-client sends SHOW_CONFIG the
moment it connects, so the sink holds replies for identities nobody subscribes to yet, for up to
`hold_seconds`, and publishes them once a matching subscription arrives.
"""
import time
from collections import Counter, deque


class Subscriptions:
    def __init__(self, hold_seconds=5.0, max_held=10000):
        self.hold_seconds = hold_seconds
        self._topics = Counter()
        self._held = deque(maxlen=max_held)  # (deadline, identity, frames)

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

    def hold(self, identity, frames, now=None):
        self._held.append(((now or time.monotonic()) + self.hold_seconds, identity, frames))

    def releasable(self, now=None):
        """Held messages whose reader now listens, or whose wait has run out, in arrival order."""
        if not self._held:
            return []
        now = now or time.monotonic()
        ready, waiting = [], deque(maxlen=self._held.maxlen)
        for deadline, identity, frames in self._held:
            (ready if now >= deadline or self.is_listening(identity) else waiting).append((deadline, identity, frames))
        self._held = waiting
        return [frames for _, _, frames in ready]
