"""The worker's pure logic: turn buffered, tokenized jobs into forward passes and back into results.

Each pass holds rows sorted by length and is capped by padded tokens (rows x longest row) and by
row count. Rows of priority jobs always go first, so a small job that arrives while a large job
is half done runs in the very next pass. Several small jobs may share one pass.
"""
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .arrays import stack_rows


@dataclass(eq=False)
class TokenizedJob:
    job_id: int
    seq: int
    offset: int
    priority: bool
    ids: list                  # token ids per text, [CLS] and [SEP] included, no padding
    special: list              # 1 where ids holds a special token
    tokens: list = None        # WordPiece strings per text, when the client asked for them
    outputs: list = field(default=None, repr=False)

    def __post_init__(self):
        self.outputs = [None] * len(self.ids)

    @property
    def done(self):
        return all(out is not None for out in self.outputs)

    def result(self):
        return stack_rows(self.outputs)


@dataclass
class Pass:
    rows: list                  # (job, row index) pairs, sorted by length
    input_ids: np.ndarray       # [n, longest] int64, zero-padded
    attention_mask: np.ndarray  # [n, longest] int64
    special_tokens_mask: np.ndarray

    def scatter(self, pooled):
        """Store each row's output in its job; returns the jobs this pass completed."""
        for (job, row), output in zip(self.rows, pooled):
            job.outputs[row] = output
        return [job for job in dict.fromkeys(job for job, _ in self.rows) if job.done]


class BatchPlanner:
    def __init__(self, max_batch_tokens=8192, max_batch_size=256, pad_id=0):
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.pad_id = pad_id
        self._priority_rows = []    # rows of every buffered priority job
        self._bulk_jobs = deque()   # each bulk job's rows are consumed before the next job's
        self._bulk_rows = []

    def add(self, job):
        rows = [(job, row) for row in range(len(job.ids))]
        if job.priority:
            self._priority_rows = _by_length(self._priority_rows + rows)
        else:
            self._bulk_jobs.append(_by_length(rows))

    def __bool__(self):
        return bool(self._priority_rows or self._bulk_rows or self._bulk_jobs)

    def next_pass(self):
        """The next forward pass, or None when nothing is buffered."""
        if self._priority_rows:
            taken, self._priority_rows = self._cut(self._priority_rows)
        elif self._bulk_rows or self._bulk_jobs:
            if not self._bulk_rows:
                self._bulk_rows = self._bulk_jobs.popleft()
            taken, self._bulk_rows = self._cut(self._bulk_rows)
        else:
            return None
        return self._pad(taken)

    def _cut(self, rows):
        """The longest prefix of length-sorted rows that fits the token budget (at least one row)."""
        count = 1
        while (count < len(rows) and count < self.max_batch_size
               and (count + 1) * _length(rows[count]) <= self.max_batch_tokens):
            count += 1
        return rows[:count], rows[count:]

    def _pad(self, rows):
        longest = _length(rows[-1])
        ids = np.full((len(rows), longest), self.pad_id, dtype=np.int64)
        attention = np.zeros((len(rows), longest), dtype=np.int64)
        special = np.zeros((len(rows), longest), dtype=np.int64)
        for i, (job, row) in enumerate(rows):
            length = len(job.ids[row])
            ids[i, :length] = job.ids[row]
            attention[i, :length] = 1
            special[i, :length] = job.special[row]
        return Pass(rows, ids, attention, special)


def drain(planner, embed):
    """Run every buffered row through `embed`, pass by pass (warm-up and in-process use)."""
    while planner:
        batch = planner.next_pass()
        batch.scatter(embed(batch))


def _length(row):
    job, index = row
    return len(job.ids[index])


def _by_length(rows):
    return sorted(rows, key=_length)
