"""The padding that lets one CUDA graph serve passes of many shapes (model.cuda_graphs), checked on
the CPU: a padded pass gives its real rows the values of the unpadded one, for each kind of model.
The graphs themselves run in tests/cuda."""
import numpy as np
import pytest

from conftest import random_texts
from encoder_server.model.cuda_graphs import pad_pass, padded_shape
from encoder_server.model.passes import plan_passes
from encoder_server.model.spec import ModelSpec, resolve_spec
from encoder_server.model.tokenizer import Tokenizer
from encoder_server.model.torch_backend import TorchBackend

TEXTS = random_texts(40, seed=3, min_words=1, max_words=30)


@pytest.mark.parametrize("shape, padded", [((1, 1), (1, 16)), ((3, 17), (4, 32)), ((8, 16), (8, 16)),
                                           ((9, 33), (16, 48)), ((57, 5), (64, 16)), ((64, 256), (64, 256))])
def test_passes_pad_to_few_shapes(shape, padded):
    assert padded_shape(*shape) == padded


def test_row_counts_up_to_256_pad_to_36_shapes_each_under_twice_its_size():
    padded = {rows: padded_shape(rows, 1)[0] for rows in range(1, 257)}
    assert sorted(set(padded.values())) == [1, 2, 4, 8, *range(16, 257, 8)]
    assert all(rows <= padded[rows] < 2 * rows or rows == 1 for rows in padded)


def _assert_padding_keeps_rows(spec, encoding):
    backend = TorchBackend(spec)
    for _, inputs in plan_passes(encoding, spec.max_batch_tokens, spec.max_batch_size):
        rows, columns = inputs.input_ids.shape
        padded = backend.run(pad_pass(inputs, *padded_shape(rows, columns)))
        real = padded[:rows, :columns] if padded.ndim > 2 else padded[:rows]
        np.testing.assert_allclose(real, backend.run(inputs), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("strategy", ["mean", "cls", "max", "last", "none"])
def test_a_padded_pass_gives_an_embedders_rows_their_unpadded_values(tiny_model, strategy):
    spec = resolve_spec(ModelSpec(model=str(tiny_model), backend="torch", max_batch_size=11,
                                  pooling_strategy=strategy))
    _assert_padding_keeps_rows(spec, Tokenizer.for_spec(spec).tokenize(TEXTS))


def test_a_padded_pass_gives_a_rerankers_and_a_sparse_models_rows_their_unpadded_values(
        tiny_cross_encoder, tiny_sparse_encoder):
    reranker = resolve_spec(ModelSpec(model=str(tiny_cross_encoder), backend="torch", max_batch_size=11))
    _assert_padding_keeps_rows(reranker, Tokenizer.for_spec(reranker).tokenize_pairs("a query", TEXTS))
    sparse = resolve_spec(ModelSpec(model=str(tiny_sparse_encoder), backend="torch", max_batch_size=11))
    _assert_padding_keeps_rows(sparse, Tokenizer.for_spec(sparse).tokenize(TEXTS))
