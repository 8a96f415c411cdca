"""encoder_server.model.pooling: pool against a plain numpy reference, and output widths."""
import numpy as np
import pytest
import torch

from encoder_server.model.pooling import MASKABLE as MASKABLE_STRATEGIES
from encoder_server.model.arrays import normalize_rows
from encoder_server.model.pooling import STRATEGIES, PoolingSpec, pool

N, SEQ, DIM, STATES = 4, 7, 5, 4          # STATES = embedding output + 3 layers
LENGTHS = [7, 4, 2, 5]                     # ragged rows, padding at the end


# ----- numpy reference -----

def ref_pool(hidden, layers, strategy, attention, special=None, normalize=False):
    """hidden: list of float64 arrays [n, seq, dim]; attention/special: int arrays [n, seq]."""
    counts = attention.astype(np.float64)
    if special is not None:
        counts = counts * (1 - special)
    lengths = attention.sum(axis=1)
    outputs = []
    for layer in layers:
        h = hidden[layer]
        rows = []
        for i in range(h.shape[0]):
            keep = counts[i] > 0
            selected = h[i][keep]
            if strategy == "mean":
                rows.append(selected.mean(axis=0) if len(selected) else np.zeros(h.shape[2]))
            elif strategy == "mean_sqrt_len":
                rows.append(selected.sum(axis=0) / np.sqrt(max(len(selected), 1e-9)))
            elif strategy == "weighted_mean":
                weights = (np.arange(h.shape[1]) + 1.0)[keep]
                total = weights.sum()
                rows.append((selected * weights[:, None]).sum(axis=0) / total if total else np.zeros(h.shape[2]))
            elif strategy == "max":
                rows.append(selected.max(axis=0) if len(selected) else np.zeros(h.shape[2]))
            elif strategy == "mean_max":
                mean = selected.mean(axis=0) if len(selected) else np.zeros(h.shape[2])
                mx = selected.max(axis=0) if len(selected) else np.zeros(h.shape[2])
                rows.append(np.concatenate([mean, mx]))
            elif strategy == "cls":
                rows.append(h[i, int(np.argmax(keep))])  # the first token that counts
            elif strategy == "last":
                rows.append(h[i, lengths[i] - 1])
            elif strategy == "none":
                row = np.zeros_like(h[i])
                row[keep] = h[i][keep]
                rows.append(row)
            else:
                raise AssertionError(strategy)
        outputs.append(np.stack(rows))
    result = np.concatenate(outputs, axis=-1)
    if normalize:
        norms = np.sqrt((result ** 2).sum(axis=-1, keepdims=True))
        result = np.where(norms > 0, result / np.where(norms > 0, norms, 1), 0.0)
    return result


# ----- inputs -----

def make_inputs(seed=0, lengths=LENGTHS, seq=SEQ, pad_value=None):
    rng = np.random.default_rng(seed)
    hidden = [rng.normal(size=(len(lengths), seq, DIM)) for _ in range(STATES)]
    attention = np.zeros((len(lengths), seq), dtype=np.int64)
    special = np.zeros((len(lengths), seq), dtype=np.int64)
    for i, length in enumerate(lengths):
        attention[i, :length] = 1
        special[i, 0] = 1               # [CLS]
        special[i, length - 1] = 1      # [SEP]
    if pad_value is not None:
        for h in hidden:
            h[attention == 0] = pad_value
    return hidden, attention, special


def run_pool(hidden, layers, strategy, attention, special=None, normalize=False, dtype=torch.float32):
    """Pooling as the served model does it: the graph pools over the pool mask, then the worker normalizes."""
    states = tuple(torch.tensor(h, dtype=dtype) for h in hidden)
    pool_mask = attention if special is None else attention * (1 - special)
    out = pool(states, layers, strategy, torch.tensor(attention), torch.tensor(pool_mask)).float().numpy()
    return normalize_rows(out) if normalize else out


ALL = ["mean", "max", "mean_max", "cls", "last", "none", "mean_sqrt_len", "weighted_mean"]  # what ref_pool knows
MASKABLE = ["mean", "max", "mean_max", "none", "mean_sqrt_len", "weighted_mean"]


def test_the_reference_knows_every_strategy_there_is():
    assert ALL == list(STRATEGIES) and MASKABLE == list(MASKABLE_STRATEGIES)


@pytest.mark.parametrize("strategy", ALL)
@pytest.mark.parametrize("layers", [(-1,), (3, 0, -1)])
def test_the_declared_output_width_is_what_pooling_computes(strategy, layers):
    hidden, attention, _ = make_inputs(3)
    assert run_pool(hidden, layers, strategy, attention).shape[-1] == PoolingSpec(strategy, layers).output_width(DIM)


# ----- tests -----

@pytest.mark.parametrize("strategy", ALL)
def test_single_layer_matches_reference(strategy):
    hidden, attention, _ = make_inputs(1)
    got = run_pool(hidden, [-1], strategy, attention)
    expected = ref_pool(hidden, [-1], strategy, attention)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", ALL)
@pytest.mark.parametrize("layers", [[-2, -1], [3, 0, 1], [-1, 1]])
def test_several_layers_concatenated_in_given_order(strategy, layers):
    hidden, attention, _ = make_inputs(2)
    got = run_pool(hidden, layers, strategy, attention)
    expected = ref_pool(hidden, layers, strategy, attention)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # the order matters: the first block is the first layer named
    single = ref_pool(hidden, [layers[0]], strategy, attention)
    width = single.shape[-1]
    np.testing.assert_allclose(got[..., :width], single, rtol=1e-5, atol=1e-5)


def test_pooled_width_for_several_layers():
    hidden, attention, _ = make_inputs(3)
    assert run_pool(hidden, [0, 1, 2], "mean", attention).shape == (N, 3 * DIM)
    assert run_pool(hidden, [0, 1], "mean_max", attention).shape == (N, 4 * DIM)
    assert run_pool(hidden, [0, 1], "none", attention).shape == (N, SEQ, 2 * DIM)


@pytest.mark.parametrize("strategy", MASKABLE)
def test_mask_cls_sep_matches_reference(strategy):
    hidden, attention, special = make_inputs(4)
    got = run_pool(hidden, [-2, -1], strategy, attention, special)
    expected = ref_pool(hidden, [-2, -1], strategy, attention, special)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # and it really differs from pooling with the special tokens counted
    unmasked = ref_pool(hidden, [-2, -1], strategy, attention)
    assert not np.allclose(got, unmasked)


def test_mask_cls_sep_mean_by_hand():
    # one row, tokens 0..4 real (0 = CLS, 4 = SEP), values = position
    hidden = [np.arange(6, dtype=np.float64).reshape(1, 6, 1).repeat(2, axis=2)]
    attention = np.array([[1, 1, 1, 1, 1, 0]])
    special = np.array([[1, 0, 0, 0, 1, 0]])
    got = run_pool(hidden, [0], "mean", attention, special)
    np.testing.assert_allclose(got, [[2.0, 2.0]])          # mean of 1, 2, 3
    got = run_pool(hidden, [0], "max", attention, special)
    np.testing.assert_allclose(got, [[3.0, 3.0]])          # SEP (4) and padding (5) excluded
    got = run_pool(hidden, [0], "mean", attention)
    np.testing.assert_allclose(got, [[2.0, 2.0]])          # mean of 0..4


def test_none_zeroes_padding():
    hidden, attention, _ = make_inputs(5, pad_value=9.0)
    got = run_pool(hidden, [-1], "none", attention)
    assert got.shape == (N, SEQ, DIM)
    for i, length in enumerate(LENGTHS):
        assert np.all(got[i, length:] == 0)
        np.testing.assert_allclose(got[i, :length], hidden[-1][i, :length], rtol=1e-6)


def test_none_with_mask_cls_sep_zeroes_special_tokens():
    hidden, attention, special = make_inputs(6)
    got = run_pool(hidden, [-1], "none", attention, special)
    for i, length in enumerate(LENGTHS):
        assert np.all(got[i, 0] == 0)
        assert np.all(got[i, length - 1] == 0)
        assert np.all(got[i, length:] == 0)
        np.testing.assert_allclose(got[i, 1:length - 1], hidden[-1][i, 1:length - 1], rtol=1e-6)


@pytest.mark.parametrize("strategy", ["mean", "max", "mean_max", "cls", "last"])
def test_normalize_gives_unit_rows(strategy):
    hidden, attention, _ = make_inputs(7)
    got = run_pool(hidden, [-2, -1], strategy, attention, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)
    expected = ref_pool(hidden, [-2, -1], strategy, attention, normalize=True)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_normalize_is_over_the_concatenation_not_per_layer():
    hidden, attention, _ = make_inputs(8)
    got = run_pool(hidden, [0, 1], "mean", attention, normalize=True)
    first_block_norms = np.linalg.norm(got[:, :DIM], axis=-1)
    assert np.all(first_block_norms < 1 - 1e-3)


def test_last_picks_last_real_token():
    # value = 100 * row + position, so the picked position can be read off
    lengths = [7, 3, 2, 5]
    hidden = [np.array([[[100.0 * i + p] * DIM for p in range(SEQ)] for i in range(len(lengths))])]
    attention = np.array([[1] * n + [0] * (SEQ - n) for n in lengths])
    got = run_pool(hidden, [0], "last", attention)
    np.testing.assert_allclose(got[:, 0], [100.0 * i + n - 1 for i, n in enumerate(lengths)])


def test_cls_picks_position_zero():
    hidden, attention, _ = make_inputs(9)
    got = run_pool(hidden, [1], "cls", attention)
    np.testing.assert_allclose(got, hidden[1][:, 0], rtol=1e-6)


@pytest.mark.parametrize("strategy", ["cls", "mean", "weighted_mean", "last"])
def test_a_left_out_prompt_moves_pooling_past_it(strategy):
    """sentence-transformers 6 with include_prompt=False: the prompt's tokens ([CLS] too) do not count,
    so cls takes the first token after the prompt; last still takes the last real token."""
    hidden, attention, _ = make_inputs(12)
    prompt = np.zeros_like(attention)
    prompt[:, :2] = 1  # [CLS] + one prompt token
    states = tuple(torch.tensor(h) for h in hidden)
    got = pool(states, [-1], strategy, torch.tensor(attention), torch.tensor(attention * (1 - prompt))).numpy()
    np.testing.assert_allclose(got, ref_pool(hidden, [-1], strategy, attention, prompt), rtol=1e-6, atol=1e-6)
    if strategy == "cls":
        longer = [i for i, length in enumerate(LENGTHS) if length > 2]
        np.testing.assert_allclose(got[longer], hidden[-1][longer, 2], rtol=1e-6)


@pytest.mark.parametrize("strategy", ["max", "mean_max"])
def test_max_ignores_larger_padding(strategy):
    hidden, attention, _ = make_inputs(10, pad_value=1e6)
    got = run_pool(hidden, [-1], strategy, attention)
    assert got.max() < 1e5
    expected = ref_pool(hidden, [-1], strategy, attention)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_mean_ignores_padding_values():
    hidden, attention, _ = make_inputs(11, pad_value=0.0)
    baseline = run_pool(hidden, [-1], "mean", attention)
    hidden2, _, _ = make_inputs(11, pad_value=1e4)
    np.testing.assert_allclose(run_pool(hidden2, [-1], "mean", attention), baseline, rtol=1e-5, atol=1e-5)


def test_max_when_all_values_negative():
    # padding zeros must not win over real negative values
    hidden, attention, _ = make_inputs(12, pad_value=0.0)
    hidden = [-np.abs(h) - 1 for h in hidden]
    for h in hidden:
        h[attention == 0] = 0.0
    got = run_pool(hidden, [-1], "max", attention)
    assert np.all(got < 0)
    np.testing.assert_allclose(got, ref_pool(hidden, [-1], "max", attention), rtol=1e-6)


@pytest.mark.parametrize("strategy", ["mean", "max", "mean_max", "none"])
def test_fully_masked_row_gives_zeros(strategy):
    # row 1 is only [CLS] [SEP]: with mask_cls_sep nothing is left to pool
    lengths = [6, 2, 4]
    hidden, attention, special = make_inputs(13, lengths=lengths, seq=6, pad_value=5.0)
    got = run_pool(hidden, [-1], strategy, attention, special)
    assert np.all(np.isfinite(got))
    assert np.all(got[1] == 0)
    expected = ref_pool(hidden, [-1], strategy, attention, special)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", ["mean", "max"])
def test_fully_masked_row_with_normalize_gives_zeros(strategy):
    lengths = [6, 2, 4]
    hidden, attention, special = make_inputs(14, lengths=lengths, seq=6)
    got = run_pool(hidden, [-1], strategy, attention, special, normalize=True)
    assert np.all(np.isfinite(got))
    assert np.all(got[1] == 0)
    np.testing.assert_allclose(np.linalg.norm(got[[0, 2]], axis=-1), 1.0, rtol=1e-5)


# --fp16 runs the model (and so this pooling) in half precision
@pytest.mark.parametrize("strategy", ["mean", "max", "mean_max"])
def test_fully_masked_row_gives_zeros_in_half_precision(strategy):
    lengths = [6, 2, 4]
    hidden, attention, special = make_inputs(15, lengths=lengths, seq=6)
    got = run_pool(hidden, [-1], strategy, attention, special, dtype=torch.float16)
    assert np.all(np.isfinite(got)), got[1]
    assert np.all(got[1] == 0)


def test_normalize_of_zero_row_in_half_precision():
    lengths = [6, 2, 4]
    hidden, attention, special = make_inputs(16, lengths=lengths, seq=6)
    got = run_pool(hidden, [-1], "max", attention, special, normalize=True, dtype=torch.float16)
    assert np.all(np.isfinite(got)), got[1]
    assert np.all(got[1] == 0)


def test_half_precision_matches_reference_on_ordinary_rows():
    hidden, attention, special = make_inputs(17, lengths=[7, 4, 3, 5])
    got = run_pool(hidden, [-1], "mean", attention, special, dtype=torch.float16)
    np.testing.assert_allclose(got, ref_pool(hidden, [-1], "mean", attention, special), atol=1e-2)
