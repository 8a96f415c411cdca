"""encoder_server.model.outputs: what a request's rows become (windows merged, Matryoshka
dimensions, precision), against sentence-transformers' quantize_embeddings."""
import numpy as np
import pytest
from sentence_transformers.util import quantize_embeddings

from encoder_server.model.arrays import normalize_rows
from encoder_server.model.outputs import Output, calibration_ranges, finish, merge_windows, quantize


@pytest.fixture(scope="module")
def rows():
    return normalize_rows(np.random.default_rng(0).normal(size=(50, 64)).astype(np.float32))


def st_ranges(starts, steps):
    """Our (starts, steps) as sentence-transformers' ranges: [minimums; maximums]."""
    return np.vstack([starts, starts + steps * 255])


@pytest.mark.parametrize("precision", ["float32", "int8", "uint8", "binary", "ubinary"])
def test_each_precision_is_sentence_transformers_quantize_embeddings(rows, precision):
    calibration = rows[:20]
    ranges = calibration_ranges(calibration)
    ours = quantize(rows, precision, ranges)
    theirs = quantize_embeddings(rows, precision, calibration_embeddings=calibration)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, quantize_embeddings(rows, precision, ranges=st_ranges(*ranges)))


def test_binary_packs_one_bit_per_dimension_first_dimension_highest():
    row = np.array([[1, -1, -1, -1, -1, -1, -1, 1, 0.5] + [-1] * 7], dtype=np.float32)
    assert quantize(row, "ubinary").tolist() == [[0b10000001, 0b10000000]]
    assert quantize(row, "binary").tolist() == [[0b10000001 - 128, 0]]


def test_float16_is_the_values_in_half_precision(rows):
    assert finish(rows, Output(precision="float16")).dtype == np.float16
    np.testing.assert_allclose(finish(rows, Output(precision="float16")), rows, atol=1e-3)


def test_int8_dequantizes_to_within_a_step(rows):
    starts, steps = calibration_ranges(rows)
    levels = quantize(rows, "int8", (starts, steps)).astype(np.float32) + 128
    assert np.all(np.abs(starts + (levels + 0.5) * steps - rows) <= steps * 0.5 + 1e-6)


def test_values_outside_the_calibration_clip_to_its_ends(rows):
    ranges = calibration_ranges(rows[:5])
    levels = quantize(rows * 10, "uint8", ranges)
    assert levels.min() == 0 and levels.max() == 255


def test_a_dimension_without_range_takes_steps_of_one():
    starts, steps = calibration_ranges(np.ones((4, 3), dtype=np.float32))
    assert steps.tolist() == [1, 1, 1] and starts.tolist() == [1, 1, 1]


def test_dimensions_cut_then_renormalize(rows):
    cut = finish(rows, Output(dimensions=16, normalize=True))
    np.testing.assert_allclose(cut, normalize_rows(rows[:, :16]), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1, rtol=1e-5)
    np.testing.assert_array_equal(finish(rows, Output(dimensions=16)), rows[:, :16])
    assert finish(rows, Output(dimensions=24, precision="ubinary")).shape == (50, 3)


def test_int8_with_dimensions_keeps_the_first_values_of_the_full_row(rows):
    ranges = calibration_ranges(rows)
    full = finish(rows, Output(precision="int8", ranges=ranges, normalize=True))
    np.testing.assert_array_equal(finish(rows, Output(precision="int8", ranges=ranges, dimensions=10, normalize=True)),
                                  full[:, :10])


def test_windows_merge_into_their_token_weighted_mean_before_normalizing():
    windows = np.array([[1, 0], [0, 1], [3, 3], [2, 0], [0, 2], [0, 0]], dtype=np.float32)
    merged = merge_windows(windows, [1, 3, 2], [5, 10, 30, 10, 4, 4])
    np.testing.assert_allclose(merged, [[1, 0], [(3 * 30 + 2 * 10) / 50, (10 + 3 * 30) / 50], [0, 1]], rtol=1e-6)
    finished = finish(windows, Output(windows=[1, 3, 2], weights=[5, 10, 30, 10, 4, 4], normalize=True))
    np.testing.assert_allclose(finished, normalize_rows(merged), rtol=1e-6)


def test_one_window_per_text_leaves_rows_as_they_are(rows):
    np.testing.assert_array_equal(finish(rows, Output(windows=[1] * len(rows))), rows)
