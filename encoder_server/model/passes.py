"""Model input: texts as token ids (Encoding), one forward pass's padded input (Pass), and how
rows sorted by length are cut into passes. Pure.

A pass is capped by padded tokens (rows x longest row) and by row count, so a 4-token text is
never padded to 256, and on the CPU holds rows of similar length, since padding there costs as much
as real tokens (on a GPU another pass costs more; see pass_cost_tokens).
"""
import itertools
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Encoding:
    """Texts as token ids, [CLS] and [SEP] included, no padding."""
    ids: list            # token ids per text
    pooled: list         # per text, 1 where the token counts in pooling; None: every token counts
    tokens: list = None  # WordPiece strings per text, when asked for
    truncated: dict = field(default_factory=dict)  # index -> its token count before truncation
    type_ids: list = None  # per text, the segment of each token: (query, document) pairs for a reranker

    def __len__(self):
        return len(self.ids)

    @property
    def num_tokens(self):
        return sum(len(row) for row in self.ids)

    def pooled_row(self, index):
        """Text `index`'s pooling mask, a list of 0 and 1."""
        return [1] * len(self.ids[index]) if self.pooled is None else self.pooled[index]


@dataclass
class Pass:
    """Padded model input: every array is [rows, longest row] int64. A model takes the arrays it
    names, by these names."""
    input_ids: np.ndarray
    attention_mask: np.ndarray
    pool_mask: np.ndarray       # 1 for the tokens that count in pooling
    token_type_ids: np.ndarray  # each token's segment: 0, and 1 for a pair's second text

    @classmethod
    def pad(cls, ids, pooled=None, pad_id=0, type_ids=None):
        """A pass from per-row token ids, pooling masks (None: every token counts, the mask is the
        attention mask) and segments, no padding in them yet, each written through one mask of the
        real tokens rather than row by row: half the time for 32 rows, as fast for 7, a few µs
        slower for two to four."""
        if len(ids) == 1:
            return cls._lone(ids, pooled, type_ids)
        lengths = list(map(len, ids))
        real = np.arange(max(lengths)) < np.array(lengths)[:, None]
        tokens = sum(lengths)
        input_ids = np.full(real.shape, pad_id, dtype=np.int64)
        input_ids[real] = _joined(ids, tokens)
        if pooled is None:
            pool_mask = real.astype(np.int64)
        else:
            pool_mask = np.zeros(real.shape, dtype=np.int64)
            pool_mask[real] = _joined(pooled, tokens)
        segments = np.zeros(real.shape, dtype=np.int64)
        if type_ids is not None:
            segments[real] = _joined(type_ids, tokens)
        return cls(input_ids, real.astype(np.int64), pool_mask, segments)

    @classmethod
    def _lone(cls, ids, pooled, type_ids):
        """A pass of one row, which needs no padding: a lone request's, whose latency users feel. Its
        fewer numpy calls matter most just after a pause, when their code is out of the caches: 45 µs
        against 100 for a medium text then, 6 against 12 back to back."""
        input_ids = np.array(ids, dtype=np.int64)
        segments = np.zeros_like(input_ids) if type_ids is None else np.array(type_ids, dtype=np.int64)
        pool_mask = np.ones_like(input_ids) if pooled is None else np.array(pooled, dtype=np.int64)
        return cls(input_ids, np.ones_like(input_ids), pool_mask, segments)

    @classmethod
    def of(cls, rows, pad_id=0):
        """A pass from (Encoding, row index) pairs."""
        every_token = all(encoding.pooled is None for encoding, _ in rows)
        return cls.pad([encoding.ids[i] for encoding, i in rows],
                       None if every_token else [encoding.pooled_row(i) for encoding, i in rows],
                       pad_id, None if rows[0][0].type_ids is None else [encoding.type_ids[i] for encoding, i in rows])

    def __len__(self):
        return len(self.input_ids)

    @property
    def padded_tokens(self):
        return self.input_ids.size

    @property
    def real_tokens(self):
        return int(self.attention_mask.sum())


def _joined(rows, count):
    """Rows of ints, `count` in all, one after another in one array."""
    return np.fromiter(itertools.chain.from_iterable(rows), np.int64, count)


# What one more forward pass costs, in padded tokens. On the CPU the bundled model on one thread
# takes about 5 ms a pass and 0.3 ms a token, and every pass reads all the weights again whatever
# its size. On a GPU a pass's fixed cost (its launches or a graph's replay, the copies in and out,
# the wait for its rows: 0.45 ms for one short text on an H200 with CUDA graphs) would compute
# thousands of tokens, more than a pass holds, so there passes are cut by the budget and the row
# limit alone; so too on the zero backend, where padding costs nothing.
PASS_COST_TOKENS = 16
GPU_PASS_COST_TOKENS = math.inf


def on_a_fast_device(device, backend=None):
    """Whether a pass is short beside the work around it: on a GPU, and on the zero backend, which
    stands in for an infinitely fast device (benchmark/pipeline.py), so that it measures the
    server's own work as a GPU host would do it."""
    return device == "cuda" or backend == "zero"


def pass_cost_tokens(device, backend=None):
    """What one more forward pass costs on `device` (or `backend`), in padded tokens."""
    return GPU_PASS_COST_TOKENS if on_a_fast_device(device, backend) else PASS_COST_TOKENS


def group_sizes(lengths, max_tokens, max_rows, pass_cost=PASS_COST_TOKENS):
    """Ascending row lengths cut into consecutive passes; returns each pass's row count. A pass
    grows while its padded size (rows x longest) fits `max_tokens`, its rows fit `max_rows`, and
    padding its rows to the next row's length costs no more than another pass would (`pass_cost`
    tokens): on the CPU, 32 short texts then take 3 passes, not 1 padded to the longest, in 0.63x
    the time."""
    sizes, start = [], 0
    while start < len(lengths):
        count = 1
        while start + count < len(lengths) and count < max_rows \
                and (count + 1) * lengths[start + count] <= max_tokens \
                and count * (lengths[start + count] - lengths[start + count - 1]) <= pass_cost:
            count += 1
        sizes.append(count)
        start += count
    return sizes


def cut_by_length(lengths, max_tokens, max_rows, pass_cost=PASS_COST_TOKENS):
    """Row indices grouped into passes of similar length (group_sizes), shortest rows first."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups, start = [], 0
    for size in group_sizes([lengths[i] for i in order], max_tokens, max_rows, pass_cost):
        groups.append(order[start:start + size])
        start += size
    return groups


def plan_passes(encoding, max_tokens, max_rows, pad_id=0, pass_cost=PASS_COST_TOKENS):
    """(row indices, Pass) for each pass that an Encoding's rows take, shortest rows first."""
    return [(group, Pass.of([(encoding, i) for i in group], pad_id))
            for group in cut_by_length([len(ids) for ids in encoding.ids], max_tokens, max_rows, pass_cost)]


def passes_for(spec, encoding, pad_id=0):
    """plan_passes within a model spec's token budget and row limit, at its device's (or backend's) pass cost."""
    return plan_passes(encoding, spec.max_batch_tokens, spec.max_batch_size, pad_id,
                       pass_cost_tokens(spec.device, spec.backend))
