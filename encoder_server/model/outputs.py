"""What a request's float32 rows become before they are served. Pure numpy.

In order: the windows of a long text are merged into one row (the mean of their pooled rows,
weighted by each window's token count), the row is cut to its first `dimensions` values
(Matryoshka), L2-normalized when asked, then stored at the `precision` asked, with
sentence-transformers' `quantize_embeddings` meaning:

- float32, float16: the values;
- int8, uint8: each value placed in 256 steps of its dimension's range, as calibrated on a sample
  (`calibration_ranges`); uint8 = floor((x - start) / step) clipped to 0..255, int8 = that - 128;
- binary, ubinary: one bit per dimension (x > 0), packed into bytes, first dimension in the
  highest bit; binary is that byte - 128 as int8, ubinary the byte as uint8.

With int8 and uint8, `dimensions` keeps the first values of the full row quantized with the
calibration's ranges (it is not renormalized first), so that one published set of ranges serves
every request and a user can dequantize: x ~ start + (q + 0.5) * step (int8: q + 128).
"""
import math
from dataclasses import dataclass

import numpy as np

from .arrays import normalize_rows

PRECISIONS = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
CALIBRATED = ("int8", "uint8")  # the precisions that need a model's calibration ranges
STEPS = 255


@dataclass(frozen=True)
class Output:
    """How a request's rows are finished; the default leaves float32 rows as they are."""
    windows: tuple = None    # rows per text, when long texts may be cut into windows (long_texts=chunk)
    weights: tuple = None    # each row's token count, when some text has several
    dimensions: int = None   # values kept per row (None: all)
    normalize: bool = False  # L2-normalize, after cutting to `dimensions`
    precision: str = "float32"
    ranges: tuple = None     # (starts, steps) per dimension, for int8 and uint8

    @property
    def plain(self):
        """Whether it changes nothing that the worker's own normalization does not."""
        return self.windows is None and self.dimensions is None and self.precision == "float32"


def finish(rows, output):
    """Float32 rows [n, dim] (the windows' rows when `output.windows`) as `output` says."""
    if output.windows is not None and len(rows) != len(output.windows):
        rows = merge_windows(rows, output.windows, output.weights)
    if output.precision in CALIBRATED:  # quantized at full width: the published ranges are per dimension
        rows = normalize_rows(rows) if output.normalize else rows
        return quantize(rows, output.precision, output.ranges)[:, :output.dimensions]
    if output.dimensions is not None:
        rows = rows[:, :output.dimensions]
    if output.normalize:
        rows = normalize_rows(np.ascontiguousarray(rows))
    return quantize(rows, output.precision)


def merge_windows(rows, windows, weights):
    """One row per text: the mean of its `windows` consecutive rows, weighted by `weights`."""
    rows = np.asarray(rows, dtype=np.float32)
    weights = np.asarray(weights, dtype=np.float64)
    starts = np.concatenate([[0], np.cumsum(windows)[:-1]]).astype(np.int64)
    sums = np.add.reduceat(rows * weights[:, None], starts, axis=0)
    return (sums / np.add.reduceat(weights, starts)[:, None]).astype(np.float32)


def quantize(rows, precision, ranges=None):
    """Rows at `precision` (see the module's docstring); int8 and uint8 need `ranges`."""
    if precision == "float32":
        return np.ascontiguousarray(rows, dtype=np.float32)
    if precision == "float16":
        return rows.astype(np.float16)
    if precision in ("binary", "ubinary"):
        packed = np.packbits(rows > 0, axis=-1)
        return (packed.astype(np.int16) - 128).astype(np.int8) if precision == "binary" else packed
    if precision not in CALIBRATED:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    starts, steps = (np.asarray(values, dtype=np.float32) for values in ranges)
    levels = np.clip(np.floor((rows - starts) / steps), 0, STEPS)
    return levels.astype(np.uint8) if precision == "uint8" else (levels - 128).astype(np.int8)


def calibration_ranges(rows):
    """(starts, steps) per dimension from sample rows, as sentence-transformers calibrates: the
    sample's minimum, and its range in 255 steps (1 where the range is empty)."""
    rows = np.asarray(rows, dtype=np.float32)
    starts = rows.min(axis=0)
    steps = (rows.max(axis=0) - starts) / STEPS
    return starts, np.where(steps == 0, 1, steps).astype(np.float32)


def is_calibration(calibration, width):
    """Whether `calibration` (from a worker's READY) holds the ranges of rows `width` wide, as
    Embedder.calibration makes them: {"raw" and "normalized": [starts, steps]}, finite numbers."""
    try:
        return set(calibration) == {"raw", "normalized"} and all(
            len(ranges) == 2 and all(len(values) == width and all(
                isinstance(value, (int, float)) and math.isfinite(value) for value in values) for values in ranges)
            for ranges in calibration.values())
    except TypeError:
        return False
