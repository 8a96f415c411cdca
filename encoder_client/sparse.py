"""Sparse vectors (a SPLADE model's rows over its vocabulary) in compressed-row form, numpy only.

Row i's non-zero entries are `indices[offsets[i]:offsets[i + 1]]` (ascending vocabulary ids) and
the `values` at the same positions, as in scipy's CSR matrix. Every instance is checked on
construction, so one read from the wire (`from_bytes`) is either well-formed or a ValueError that
names what is wrong. The wire form is one buffer: offsets (int64), then indices (int32), then
values (float32), all little-endian.
"""
from dataclasses import dataclass

import numpy as np

_OFFSET, _INDEX, _VALUE = np.dtype("<i8"), np.dtype("<i4"), np.dtype("<f4")


@dataclass(frozen=True, eq=False)
class SparseVectors:
    indices: np.ndarray  # int32 [nnz], ascending within each row
    values: np.ndarray   # float32 [nnz]
    offsets: np.ndarray  # int64 [rows + 1]: row i is [offsets[i], offsets[i + 1])
    dim: int             # the width of a row (a model's vocabulary size)

    def __post_init__(self):
        for name, dtype in (("indices", _INDEX), ("values", _VALUE), ("offsets", _OFFSET)):
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype))
        object.__setattr__(self, "dim", int(self.dim))
        _check(self)

    def __len__(self):
        return len(self.offsets) - 1

    @property
    def shape(self):
        return len(self), self.dim

    @property
    def nnz(self):
        return len(self.indices)

    def row(self, i):
        """(indices, values) of row `i` (negative counts from the end)."""
        i = range(len(self))[i]
        start, end = self.offsets[i], self.offsets[i + 1]
        return self.indices[start:end], self.values[start:end]

    @classmethod
    def from_dense(cls, array):
        """The non-zero entries of a [rows, dim] array."""
        array = np.asarray(array)
        if array.ndim != 2:
            raise ValueError(f"from_dense takes a [rows, dim] array, got shape {array.shape}")
        rows, columns = np.nonzero(array)  # row-major: columns ascend within each row
        counts = np.bincount(rows, minlength=len(array))
        return cls(columns, array[rows, columns], np.concatenate([[0], np.cumsum(counts)]), array.shape[1])

    def to_dense(self):
        dense = np.zeros(self.shape, dtype=np.float32)
        dense[self._row_ids(), self.indices] = self.values
        return dense

    def top_k(self, k):
        """Each row's `k` entries of largest magnitude (as sentence-transformers' max_active_dims keeps them),
        indices still ascending."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"top_k must be a positive integer, got {k!r}")
        rows = self._row_ids()
        by_size = np.lexsort((-np.abs(self.values), rows))  # row by row, largest first
        rank = np.arange(self.nnz) - self.offsets[rows[by_size]]
        kept = np.sort(by_size[rank < k])  # back to row-major, ascending order
        counts = np.bincount(rows[kept], minlength=len(self))
        return SparseVectors(self.indices[kept], self.values[kept], np.concatenate([[0], np.cumsum(counts)]),
                             self.dim)

    def take(self, rows):
        """The given rows, in that order."""
        rows = np.arange(len(self))[np.asarray(rows, dtype=np.int64)]  # negatives count from the end
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        counts = ends - starts
        positions = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())
        return SparseVectors(self.indices[positions], self.values[positions],
                             np.concatenate([[0], np.cumsum(counts)]), self.dim)

    def to_scipy(self):
        """A scipy.sparse.csr_matrix of the same rows (scipy is not a dependency of the client)."""
        try:
            from scipy.sparse import csr_matrix
        except ImportError:
            raise ImportError("SparseVectors.to_scipy needs scipy, which is not installed: pip install scipy") from None
        return csr_matrix((self.values, self.indices, self.offsets), shape=self.shape)

    @classmethod
    def concat(cls, parts):
        """The rows of several SparseVectors of one width, in order."""
        parts = list(parts)
        if not parts:
            raise ValueError("concat needs at least one part")
        if len({part.dim for part in parts}) > 1:
            raise ValueError(f"concat takes parts of one width, got {sorted({part.dim for part in parts})}")
        starts = np.cumsum([0] + [part.nnz for part in parts])
        offsets = [parts[0].offsets[:1]] + [part.offsets[1:] + start for part, start in zip(parts, starts)]
        return cls(np.concatenate([part.indices for part in parts]), np.concatenate([part.values for part in parts]),
                   np.concatenate(offsets), parts[0].dim)

    def to_bytes(self):
        """offsets, indices and values, one after the other (see from_bytes)."""
        return b"".join(array.tobytes() for array in (self.offsets, self.indices, self.values))

    @classmethod
    def from_bytes(cls, buffer, rows, nnz, dim):
        """The SparseVectors that `to_bytes` wrote, read without a copy; ValueError naming the problem
        for a buffer of the wrong size or inconsistent content."""
        for name, number in (("rows", rows), ("nnz", nnz), ("dim", dim)):
            if isinstance(number, bool) or not isinstance(number, (int, np.integer)) or number < 0:
                raise ValueError(f"sparse vectors: {name} must be a non-negative integer, got {number!r}")
        buffer = memoryview(buffer).cast("B")
        expected = (rows + 1) * _OFFSET.itemsize + nnz * (_INDEX.itemsize + _VALUE.itemsize)
        if len(buffer) != expected:
            raise ValueError(f"sparse vectors: {len(buffer)} bytes, expected {expected} for {rows} rows and "
                             f"{nnz} non-zero entries")
        offsets = np.frombuffer(buffer, _OFFSET, rows + 1)
        indices = np.frombuffer(buffer, _INDEX, nnz, offsets.nbytes)
        values = np.frombuffer(buffer, _VALUE, nnz, offsets.nbytes + indices.nbytes)
        return cls(indices, values, offsets, dim)

    def _row_ids(self):
        """The row of each stored entry."""
        return np.repeat(np.arange(len(self)), np.diff(self.offsets))


def _check(vectors):
    """ValueError naming the first way `vectors` is not well-formed."""
    offsets, indices = vectors.offsets, vectors.indices
    problem = None
    if offsets.ndim != 1 or indices.ndim != 1 or vectors.values.ndim != 1 or len(offsets) < 1:
        problem = "offsets, indices and values must be 1-D, and offsets hold at least one entry"
    elif len(indices) != len(vectors.values):
        problem = f"{len(indices)} indices but {len(vectors.values)} values"
    elif vectors.dim < 0:
        problem = f"dim must not be negative, got {vectors.dim}"
    elif offsets[0] != 0 or offsets[-1] != len(indices):
        problem = f"offsets must run from 0 to nnz ({len(indices)}), got {offsets[0]} to {offsets[-1]}"
    elif (np.diff(offsets) < 0).any():
        problem = "offsets decrease"
    elif len(indices) and (indices.min() < 0 or indices.max() >= vectors.dim):
        problem = f"an index is outside 0..{vectors.dim - 1} (dim {vectors.dim})"
    elif _unordered_within_rows(offsets, indices):
        problem = "indices are not strictly ascending within a row"
    if problem:
        raise ValueError(f"sparse vectors: {problem}")


def _unordered_within_rows(offsets, indices):
    steps_ok = np.diff(indices) > 0
    row_starts = offsets[1:-1]  # a step into a new row may go down
    steps_ok[row_starts[(row_starts > 0) & (row_starts < len(indices))] - 1] = True
    return not steps_ok.all()
