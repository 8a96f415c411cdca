"""The worker's pure logic: turn buffered, tokenized jobs into forward passes and back into results.

Each pass holds rows sorted by length and is capped by padded tokens (rows x longest row) and by
row count, so a 4-token text is never padded to 256. Jobs of different requests and clients
share passes.
"""
import time
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field

from ..model.arrays import stack_rows
from ..model.passes import PASS_COST_TOKENS, Encoding, Pass, group_sizes
from .messages import Job


@dataclass(eq=False)
class Tokenized:
    """A job while the worker holds it: its texts as token ids, and their outputs as passes fill them."""
    job: Job
    encoding: Encoding
    arrived: float = field(default_factory=time.monotonic)  # when the worker received the job
    started: bool = False      # whether a pass has taken any of its rows
    outputs: list = field(default=None, repr=False)
    lengths: list = field(default=None, repr=False)  # tokens per row

    def __post_init__(self):
        self.outputs = [None] * len(self.encoding)
        self.lengths = [len(ids) for ids in self.encoding.ids]

    @property
    def priority(self):
        return self.job.priority

    @property
    def ids(self):
        return self.encoding.ids

    @property
    def done(self):
        return all(out is not None for out in self.outputs)

    def result(self):
        return stack_rows(self.outputs)

    def queue_wait(self, now):
        """Seconds since its request was admitted: the ventilator's part, then ours (both durations)."""
        return self.job.waited_ms / 1000 + max(0.0, now - self.arrived)


@dataclass
class Batch:
    """A planned forward pass: which rows it holds, and their padded input."""
    rows: list       # (Tokenized, row index) pairs, sorted by length
    inputs: Pass

    def start(self, now):
        """Mark the pass's jobs as started; returns the queue wait of each job it starts."""
        waits = []
        for job in dict.fromkeys(job for job, _ in self.rows):
            if not job.started:
                job.started = True
                waits.append(job.queue_wait(now))
        return waits

    def scatter(self, pooled):
        """Store each row's output in its job; returns the jobs this pass completed."""
        for (job, row), output in zip(self.rows, pooled):
            job.outputs[row] = output
        return [job for job in dict.fromkeys(job for job, _ in self.rows) if job.done]


PRIORITY, BULK = "priority", "bulk"
# padding a few tokens costs less than another pass, which re-reads every weight of the model
MIN_PADDING = 4


class BatchPlanner:
    """Buffered rows in two lanes. The worker runs each lane on its own thread, so a priority pass
    never waits behind a bulk pass; within a lane, passes are cut from rows sorted by length.

    A bulk pass is anchored at the oldest job's longest remaining row (first come, first served)
    and filled, longest first, with rows of any buffered job, from any client, that are at most a
    quarter (or MIN_PADDING tokens) shorter, so padding stays small; where a pass costs more than
    any padding (`pass_cost` tokens, on a GPU), with any shorter rows. The oldest job's rows are
    taken first among those that fit.
    """

    def __init__(self, max_batch_tokens=1024, max_batch_size=64, pad_id=0, pass_cost=PASS_COST_TOKENS):
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.pad_id = pad_id
        self.pass_cost = pass_cost
        self._priority_rows = []    # rows of every buffered priority job, sorted by length
        self._bulk = deque()        # [job, its rows not yet taken, sorted by length, their lengths], oldest first

    def add(self, job):
        rows = [(job, row) for row in range(len(job.ids))]
        if job.priority:
            self._priority_rows = _by_length(self._priority_rows + rows)
        else:
            rows = _by_length(rows)
            self._bulk.append([job, rows, [_length(row) for row in rows]])

    def has(self, lane):
        return bool(self._priority_rows) if lane == PRIORITY else bool(self._bulk)

    def __bool__(self):
        return self.has(PRIORITY) or self.has(BULK)

    def ready(self, lane, wait_s=0.0, now=None):
        """Whether the lane should run now. Priority rows may wait up to `wait_s` after the oldest
        arrived, for more small requests to share their pass, unless they already fill one."""
        if not self.has(lane):
            return False
        rows = self._priority_rows
        if lane == BULK or wait_s <= 0 or len(rows) >= self.max_batch_size \
                or _length(rows[-1]) * len(rows) >= self.max_batch_tokens:
            return True
        now = time.monotonic() if now is None else now
        return now >= min(job.arrived for job, _ in rows) + wait_s

    def next_pass(self, lane=None):
        """The next forward pass of a lane (default: priority, else bulk), or None when it is empty."""
        lane = lane or (PRIORITY if self._priority_rows else BULK)
        if lane == PRIORITY and self._priority_rows:
            taken, self._priority_rows = self._cut(self._priority_rows)
        elif lane == BULK and self._bulk:
            taken = self._next_bulk_rows()
        else:
            return None
        return self._pad(taken)

    def _next_bulk_rows(self):
        longest = self._bulk[0][2][-1]
        floor = 0 if self.pass_cost >= self.max_batch_tokens else longest - max(longest // 4, MIN_PADDING)
        room = max(1, min(self.max_batch_size, self.max_batch_tokens // longest))
        taken = []
        for entry in self._bulk:
            rows, lengths = entry[1], entry[2]
            top, bottom = bisect_right(lengths, longest), bisect_left(lengths, floor)
            start = max(bottom, top - room)
            taken += rows[start:top]
            entry[1], entry[2] = rows[:start] + rows[top:], lengths[:start] + lengths[top:]
            room -= top - start
            if room <= 0:
                break
        self._bulk = deque(entry for entry in self._bulk if entry[1])
        return _by_length(taken)

    def _cut(self, rows):
        """(the next pass's rows, the rest) from length-sorted rows: of the passes of similar length
        they make (group_sizes), the one holding the oldest job's row, so that none waits forever."""
        oldest = min(range(len(rows)), key=lambda index: rows[index][0].arrived)
        start = 0
        for size in group_sizes([_length(row) for row in rows], self.max_batch_tokens, self.max_batch_size,
                                self.pass_cost):
            if oldest < start + size:
                return rows[start:start + size], rows[:start] + rows[start + size:]
            start += size

    def _pad(self, rows):
        inputs = Pass.of([(job.encoding, row) for job, row in rows], self.pad_id)
        return Batch(rows, inputs)


def _length(row):
    return row[0].lengths[row[1]]


def _by_length(rows):
    return sorted(rows, key=_length)
