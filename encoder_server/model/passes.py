"""Model input: texts as token ids (Encoding), one forward pass's padded input (Pass), and how
rows sorted by length are cut into passes. Pure.

A pass is capped by padded tokens (rows x longest row) and by row count, so a 4-token text is
never padded to 256.
"""
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Encoding:
    """Texts as token ids, [CLS] and [SEP] included, no padding."""
    ids: list            # token ids per text
    pooled: list         # per text, 1 where the token counts in pooling
    tokens: list = None  # WordPiece strings per text, when asked for
    truncated: dict = field(default_factory=dict)  # index -> its token count before truncation

    def __len__(self):
        return len(self.ids)

    @property
    def num_tokens(self):
        return sum(len(row) for row in self.ids)


@dataclass
class Pass:
    """Padded model input: every array is [rows, longest row] int64."""
    input_ids: np.ndarray
    attention_mask: np.ndarray
    pool_mask: np.ndarray  # 1 for the tokens that count in pooling

    @classmethod
    def pad(cls, ids, pooled, pad_id=0):
        """A pass from per-row token ids and pooling masks (no padding in them yet)."""
        longest = max(len(row) for row in ids)
        input_ids = np.full((len(ids), longest), pad_id, dtype=np.int64)
        attention = np.zeros((len(ids), longest), dtype=np.int64)
        pool_mask = np.zeros((len(ids), longest), dtype=np.int64)
        for i, (row, row_pooled) in enumerate(zip(ids, pooled)):
            input_ids[i, :len(row)] = row
            attention[i, :len(row)] = 1
            pool_mask[i, :len(row)] = row_pooled
        return cls(input_ids, attention, pool_mask)

    def __len__(self):
        return len(self.input_ids)

    @property
    def padded_tokens(self):
        return self.input_ids.size

    @property
    def real_tokens(self):
        return int(self.attention_mask.sum())


def fitting_prefix(lengths, max_tokens, max_rows):
    """How many of these ascending row lengths one pass takes: the longest prefix whose padded
    size fits `max_tokens` and whose count fits `max_rows` (at least one row)."""
    count = 1
    while count < min(len(lengths), max_rows) and (count + 1) * lengths[count] <= max_tokens:
        count += 1
    return count


def cut_by_length(lengths, max_tokens, max_rows):
    """Row indices grouped into passes: shortest rows first, each pass a fitting prefix."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    ascending = [lengths[i] for i in order]
    groups, start = [], 0
    while start < len(order):
        count = fitting_prefix(ascending[start:start + max_rows], max_tokens, max_rows)
        groups.append(order[start:start + count])
        start += count
    return groups


def plan_passes(encoding, max_tokens, max_rows, pad_id=0):
    """(row indices, Pass) for each pass that an Encoding's rows take, shortest rows first."""
    return [(group, Pass.pad([encoding.ids[i] for i in group], [encoding.pooled[i] for i in group], pad_id))
            for group in cut_by_length([len(ids) for ids in encoding.ids], max_tokens, max_rows)]
