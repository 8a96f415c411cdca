"""What the sink owes its clients: replies it cannot publish yet, within byte budgets. Pure.

A reply waits here while nobody subscribes to its identity yet (ZeroMQ's "slow joiner"), for up
to `hold_seconds`, or while its subscribers' queue is full, for up to `slow_seconds`. Replies
waiting for a listening identity are offered again, in order: at every release() while its reader
took one within STUCK_AFTER seconds (the sink then releases whenever ZeroMQ reports room), and
ever more rarely after that (at most every MAX_RETRY_SECONDS) the longer it takes none.

Every byte the sink keeps for a client counts against the same budgets, whatever protocol the
client speaks. An identity's unread bytes are its replies waiting here plus the last two
published to it: the sink's result socket queues at most one message per subscriber and writes
one more (SNDHWM 1), so those two may still be in ZeroMQ's hands. A reply that would take its
identity past `per_identity` bytes is refused; one that would take all waiting replies past
`total` bytes makes the identity holding the most give up its oldest first (a client that reads
loses nothing to one that does not). `reserve` bytes more are allowed for the small error
replies that tell a client why.
"""
import heapq
import itertools
import time
from collections import Counter, deque
from dataclasses import dataclass

STUCK_AFTER = 0.05
MAX_RETRY_SECONDS = 0.1
PER_TURN = 64  # replies offered to one identity per release(), so that one reader never holds up the rest


@dataclass(eq=False)
class Held:
    deadline: float
    identity: bytes
    frames: list
    size: int
    slow: bool = False   # held because the reader's queue was full, not because nobody listened
    reserve: int = 0     # bytes it may use beyond the budgets: an error that says why a result was dropped
    done: bool = False   # published, expired or dropped: the indexes skip it


def size_of(frames):
    return sum(len(frame) for frame in frames)


class Backlog:
    def __init__(self, per_identity, total, hold_seconds=5.0, slow_seconds=30.0):
        self.per_identity = per_identity
        self.total = total
        self.hold_seconds = hold_seconds
        self.slow_seconds = slow_seconds
        self.held_bytes = 0
        self._waiting = {}       # identity -> its Held replies, oldest first
        self._bytes = Counter()  # identity -> bytes of its waiting replies
        self._queued = {}        # identity -> sizes of the last two replies published to it
        self._deadlines = []     # heap of (deadline, n, Held)
        self._largest = []       # heap of (-bytes, n, identity); entries whose bytes changed are skipped
        self._ready = {}         # listening identities whose reader took a reply lately: offered every time
        self._retries = []       # heap of (when, n, identity): the other listening identities to offer to
        self._retry_at = {}      # identity -> its current entry's time in _retries
        self._progress = {}      # identity -> when its reader last took a reply (or began to be waited on)
        self._order = itertools.count()

    # ----- what a client costs -----

    def unread(self, identity):
        return self._bytes[identity] + sum(self._queued.get(identity, ()))

    def owes(self, identity):
        """Whether replies for `identity` wait here (a new one must queue behind them)."""
        return identity in self._waiting

    def owes_any(self, is_listening):
        """Whether replies wait here for an identity that `is_listening` says has a reader."""
        return any(is_listening(identity) for identity in self._waiting)

    def stalled(self, longer_than, now=None):
        """The identities whose replies wait while their reader has taken none for more than
        `longer_than` seconds (or, nobody listening, since the first began to wait)."""
        now = time.monotonic() if now is None else now
        return [identity for identity, since in self._progress.items() if now - since > longer_than]

    def published(self, identity, size):
        """A reply of `size` bytes went out to `identity`: ZeroMQ may hold it until it is read."""
        last = self._queued.get(identity, ())
        self._queued[identity] = (last[-1], size) if last else (size,)

    def unsubscribed(self, identity):
        """Nobody subscribes to `identity` any more: ZeroMQ dropped its queue."""
        self._queued.pop(identity, None)
        self._ready.pop(identity, None)
        self._retry_at.pop(identity, None)

    # ----- holding -----

    def hold(self, identity, frames, slow=False, now=None, reserve=0):
        """Keep a reply for later. Returns the replies dropped to stay within the budgets: the new
        one when its identity has too much unread, else the oldest of the largest other holders'."""
        now = time.monotonic() if now is None else now
        held = Held(now + (self.slow_seconds if slow else self.hold_seconds), identity, frames, size_of(frames), slow,
                    reserve)
        if self.unread(identity) + held.size > self.per_identity + reserve:
            return [held]
        dropped = []
        while self.held_bytes + held.size > self.total + reserve:
            victim = self._largest_holder()
            if victim is None or victim == identity:
                return [*dropped, held]
            dropped.append(self._take(self._waiting[victim][0]))
        self._waiting.setdefault(identity, deque()).append(held)
        self._bytes[identity] += held.size
        self.held_bytes += held.size
        self._note_size(identity)
        heapq.heappush(self._deadlines, (held.deadline, next(self._order), held))
        self._progress.setdefault(identity, now)
        if slow and identity not in self._retry_at:
            self._ready[identity] = True
        return dropped

    def listening(self, identity, now=None):
        """A subscriber of `identity` appeared: offer it its waiting replies."""
        if identity in self._waiting:
            self._progress[identity] = time.monotonic() if now is None else now
            self._retry_at.pop(identity, None)
            self._ready[identity] = True

    def waits_for_room(self):
        """Whether a reader that has been taking replies has more waiting: release() should run
        as soon as ZeroMQ has room for it."""
        return bool(self._ready)

    # ----- releasing -----

    def release(self, publish, is_listening, now=None):
        """Offer the waiting replies of each listening identity that is ready or due to
        `publish(held)`, which says whether it went out, in order, up to the first its reader has
        no room for. Returns the replies whose wait has run out, let go."""
        now = time.monotonic() if now is None else now
        due = list(self._ready)
        while self._retries and self._retries[0][0] <= now:
            when, _, identity = heapq.heappop(self._retries)
            if self._retry_at.get(identity) == when:  # else rescheduled, or no longer waited on
                del self._retry_at[identity]
                due.append(identity)
        for identity in due:
            if identity in self._waiting and is_listening(identity):
                self._offer(identity, publish, now)
            else:
                self._ready.pop(identity, None)
        expired = []
        while self._deadlines and self._deadlines[0][0] <= now:
            held = heapq.heappop(self._deadlines)[2]
            if not held.done:
                expired.append(self._take(held))
        return expired

    def _offer(self, identity, publish, now):
        waiting, sent = self._waiting[identity], 0
        while sent < PER_TURN and waiting and publish(waiting[0]):
            self.published(identity, waiting[0].size)
            self._take(waiting[0])
            sent += 1
        if identity not in self._waiting:
            return
        if sent:
            self._progress[identity] = now
        idle = now - self._progress[identity]
        if idle >= STUCK_AFTER:
            self._ready.pop(identity, None)
            self._retry(identity, now + min(MAX_RETRY_SECONDS, idle / 2))
        else:
            self._ready[identity] = True

    def next_due(self):
        """When release() next has something to do (None: only when a reply is held)."""
        while self._retries and self._retry_at.get(self._retries[0][2]) != self._retries[0][0]:
            heapq.heappop(self._retries)  # rescheduled, or no longer waited on
        while self._deadlines and self._deadlines[0][2].done:
            heapq.heappop(self._deadlines)
        times = [heap[0][0] for heap in (self._retries, self._deadlines) if heap]
        return min(times) if times else None

    # ----- books -----

    def _retry(self, identity, when):
        if self._retry_at.get(identity, float("inf")) > when:
            self._retry_at[identity] = when
            heapq.heappush(self._retries, (when, next(self._order), identity))

    def _largest_holder(self):
        while self._largest:
            negative, _, identity = self._largest[0]
            if -negative == self._bytes.get(identity):
                return identity
            heapq.heappop(self._largest)
        return None

    def _note_size(self, identity):
        size = self._bytes.get(identity)
        if size:
            heapq.heappush(self._largest, (-size, next(self._order), identity))
        if len(self._largest) > 2 * len(self._bytes) + 64:  # stale entries: rebuild
            self._largest = [(-size, next(self._order), identity) for identity, size in self._bytes.items()]
            heapq.heapify(self._largest)

    def _take(self, held):
        held.done = True
        identity = held.identity
        self.held_bytes -= held.size
        self._bytes[identity] -= held.size
        waiting = self._waiting[identity]
        while waiting and waiting[0].done:
            waiting.popleft()
        if not waiting:
            del self._waiting[identity], self._bytes[identity], self._progress[identity]
            self._ready.pop(identity, None)
            self._retry_at.pop(identity, None)
        else:
            self._note_size(identity)
        return held
