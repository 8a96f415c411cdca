"""Who is subscribed on the sink's XPUB socket, and the replies that cannot be published yet.

A client's SUB subscription reaches the sink some milliseconds after it connects (ZeroMQ's
"slow joiner"); a reply published before then is lost. bert-serving-client sends SHOW_CONFIG the
moment it connects, so the sink holds replies for identities nobody subscribes to yet, for up to
`hold_seconds`, and publishes them once a matching subscription arrives. A reply whose reader's
queue is full is held too, for `slow_seconds`, and tried again. Held replies are capped in bytes;
the soonest to expire go first. Held replies are indexed by identity and by deadline, so a
flood of replies nobody reads costs each of them a constant, not a rescan of all the others.

The sink's XPUB is in manual mode: it applies only the subscriptions it accepts. A SUB socket's
topic is a prefix (an empty one would receive every client's embeddings), so a topic is refused
when it is empty, or when it is a prefix of an accepted topic or has one as its prefix: every
reply then reaches the subscribers of its exact identity and no one else. Random identities (the
clients' default) never overlap; an attacker's prefix can only make a victim's subscription fail
(its client times out connecting), never read its replies. Accepted topics are capped in total
and per peer (its CURVE key, else its address), so a flood of topics from one peer leaves room
for the others.
"""
import bisect
import heapq
import itertools
import time
from collections import Counter, deque
from dataclasses import dataclass

from encoder_client.protocol import MAX_IDENTITY_BYTES


@dataclass(eq=False)
class Held:
    deadline: float
    identity: bytes
    frames: list
    size: int
    slow: bool = False  # held because the reader's queue was full, not because nobody listened
    done: bool = False  # published, expired or evicted: the indexes skip it


def topic_change(message):
    """(True, topic) for a subscription message from XPUB, (False, topic) for an unsubscription;
    None for one to refuse: an empty topic, one longer than any identity, or no message at all."""
    if len(message) < 2 or message[0] not in (0, 1) or len(message) - 1 > MAX_IDENTITY_BYTES:
        return None
    return message[0] == 1, bytes(message[1:])


class Subscriptions:
    def __init__(self, hold_seconds=5.0, slow_seconds=30.0, max_held_bytes=256 << 20, max_topics=100_000,
                 max_topics_per_peer=10_000):
        self.hold_seconds = hold_seconds
        self.slow_seconds = slow_seconds
        self.max_held_bytes = max_held_bytes
        self.evicted = 0
        self.max_topics = max_topics
        self.max_topics_per_peer = max_topics_per_peer
        # XPUB reports every subscription a peer asks for, and when a peer goes, an unsubscription
        # for each of them, applied or refused alike: so an accepted topic counts its subscriptions,
        # refused ones too (a second subscriber of an identity), and listens until none is left
        self._listeners = Counter()  # accepted topic -> subscriptions of it
        self._sorted = []          # the accepted topics, sorted, to find those a new one prefixes
        self._peer_of = {}         # accepted topic -> the peer whose subscription it was accepted for
        self._per_peer = Counter()  # peer -> its accepted topics
        self._held = {}           # identity -> its held replies, in arrival order
        self._deadlines = []      # heap of (deadline, arrival, Held)
        self._arrival = itertools.count()
        self._to_release = set()  # identities that listen and have held replies to offer
        self._held_count = 0
        self._held_bytes = 0

    def update(self, message, owned=True, peer=None):
        """Apply one XPUB message (b'\\x01topic' subscribes, b'\\x00topic' unsubscribes); returns
        its (subscribe, topic) for the sink to apply to the socket, or None when refused. `owned`:
        False when, under CURVE, the topic belongs to another client key than the sender's. `peer`
        (its CURVE key, else its address) has at most max_topics_per_peer accepted topics, so one
        peer's flood leaves room for the others."""
        change = topic_change(message)
        if change is None:
            return None
        subscribe, topic = change
        if not subscribe:
            return change if owned and self._forget_one(topic) else None
        if topic in self._listeners:
            self._listeners[topic] += 1
            return change if owned else None
        if (not owned or len(self._listeners) >= self.max_topics or self._per_peer[peer] >= self.max_topics_per_peer
                or self._overlaps(topic)):
            return None
        self._listeners[topic] = 1
        bisect.insort(self._sorted, topic)
        self._peer_of[topic] = peer
        self._per_peer[peer] += 1
        if topic in self._held:
            self._to_release.add(topic)
        return change

    def _forget_one(self, topic):
        """Count one subscription of `topic` gone; False if it was never counted (it was refused)."""
        if topic not in self._listeners:
            return False
        self._listeners[topic] -= 1
        if not self._listeners[topic]:
            del self._listeners[topic]
            del self._sorted[bisect.bisect_left(self._sorted, topic)]
            peer = self._peer_of.pop(topic)
            self._per_peer[peer] -= 1
            if not self._per_peer[peer]:
                del self._per_peer[peer]
        return True

    def _overlaps(self, topic):
        """Whether an accepted topic is a prefix of `topic`, or `topic` a prefix of one."""
        if any(topic[:length] in self._listeners for length in range(1, len(topic))):
            return True
        after = bisect.bisect_right(self._sorted, topic)
        return after < len(self._sorted) and self._sorted[after].startswith(topic)

    def is_listening(self, identity):
        return identity in self._listeners

    def hold(self, identity, frames, now=None, slow=False):
        """Keep a reply for later: until its reader listens (or for slow_seconds when `slow`)."""
        now = now or time.monotonic()
        held = Held(now + (self.slow_seconds if slow else self.hold_seconds), identity, frames,
                    sum(len(frame) for frame in frames), slow)
        self._held.setdefault(identity, deque()).append(held)
        heapq.heappush(self._deadlines, (held.deadline, next(self._arrival), held))
        self._held_count += 1
        self._held_bytes += held.size
        if self.is_listening(identity):
            self._to_release.add(identity)
        while self._held_bytes > self.max_held_bytes and self._held_count > 1:
            evicted = heapq.heappop(self._deadlines)[2]
            if not evicted.done:
                self._take(evicted)
                self.evicted += 1

    def release(self, publish, now=None):
        """Offer held replies to `publish(held)`, which says whether it went out: each listening
        identity's in arrival order, up to the first its reader has no room for (offered again next
        time). Returns the replies whose wait has run out, let go."""
        for identity in list(self._to_release):
            waiting = self._held.get(identity, ())
            while waiting and self.is_listening(identity) and publish(waiting[0]):
                self._take(waiting[0])
            if not waiting or not self.is_listening(identity):
                self._to_release.discard(identity)
        now = now or time.monotonic()
        expired = []
        while self._deadlines and self._deadlines[0][0] <= now:
            held = heapq.heappop(self._deadlines)[2]
            if not held.done:
                expired.append(self._take(held))
        return expired

    def _take(self, held):
        held.done = True
        self._held_count -= 1
        self._held_bytes -= held.size
        waiting = self._held.get(held.identity)
        while waiting and waiting[0].done:
            waiting.popleft()
        if waiting is not None and not waiting:
            del self._held[held.identity]
        return held
