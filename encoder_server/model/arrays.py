"""Embedding arrays: L2 normalization, and joining arrays whose token axis may differ (token-level
`none` pooling)."""
import numpy as np


def stack_rows(rows):
    """Per-text outputs ([dim] or [seq, dim]) into one array, one row per text."""
    return np.stack(_pad_to_common_length(rows, axis=0))


def concat_parts(parts):
    """A request's parts ([n, dim] or [n, seq, dim]) into one array, in the given order."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(_pad_to_common_length(parts, axis=1), axis=0)


def pad_token_axis(array, length, axis):
    if array.shape[axis] >= length:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, length - array.shape[axis])
    return np.pad(array, widths)


def _pad_to_common_length(arrays, axis):
    if arrays[0].ndim <= axis + 1:
        return arrays  # no token axis: pooled vectors
    longest = max(a.shape[axis] for a in arrays)
    return [pad_token_axis(a, longest, axis) for a in arrays]


def normalize_rows(array):
    """Each vector (the last axis) scaled to unit length; zero vectors (padding) stay zero."""
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    return (array / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
