"""The onnx backend against the torch backend, the export cache and the int8 accuracy check."""
import dataclasses
import statistics
import time

import numpy as np
import pytest

from encoder_server import Embedder
from encoder_server.model.prepare import prepare_model
from encoder_server.model.model_cache import onnx_files
from encoder_server.model.onnx_backend import OnnxBackend
from encoder_server.model.passes import plan_passes
from encoder_server.model.quantization_check import check_int8, neighbour_overlap, row_cosine
from encoder_server.model.model_folder import ConfigError
from encoder_server.settings import resolve

from conftest import random_texts, running_server

TEXTS = random_texts(23, seed=7, max_words=40) + ["cat"]


def embed(settings, texts=TEXTS):
    return Embedder(settings).embed_texts(texts)


def settings_for(model, backend, **choices):
    """Small token budgets, so that TEXTS take several padded passes."""
    return prepare_model(resolve(model=str(model), backend=backend, num_worker=1, threads_per_worker=1,
                                 max_batch_tokens=300, max_batch_size=8, priority_batch_size=8, **choices))


@pytest.mark.parametrize("strategy", ["mean", "max", "mean_max", "cls", "last", "none"])
@pytest.mark.parametrize("layers", [[-1], [0, -2]])
def test_onnx_matches_torch_for_every_pooling(tiny_model, strategy, layers):
    choices = dict(pooling_strategy=strategy, pooling_layer=layers, max_seq_len=48)
    expected = embed(settings_for(tiny_model, "torch", **choices))
    actual = embed(settings_for(tiny_model, "onnx", **choices))
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("extra", [{"mask_cls_sep": True}, {"normalize": True},
                                   {"mask_cls_sep": True, "pooling_strategy": "max"}])
def test_onnx_matches_torch_with_masking_and_normalizing(tiny_model, extra):
    expected = embed(settings_for(tiny_model, "torch", **extra))
    actual = embed(settings_for(tiny_model, "onnx", **extra))
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=1e-4)


def test_export_cache_is_reused_and_keyed_by_what_is_baked_in(tiny_model, onnx_cache):
    settings = resolve(model=str(tiny_model), backend="onnx", pooling_strategy="cls", pooling_layer=[1])
    first, _ = onnx_files(settings)
    built_at = first.stat().st_mtime_ns
    again, _ = onnx_files(settings)
    assert again == first and again.stat().st_mtime_ns == built_at
    other, _ = onnx_files(dataclasses.replace(settings, pooling_layer=(2,)))
    assert other != first and other.parent.parent == onnx_cache


def test_int8_check_reports_and_refuses_below_the_bar(tiny_model):
    settings = resolve(model=str(tiny_model), backend="onnx", quantize="int8", min_quant_cosine=0.5)
    fp32_file, int8_file = onnx_files(settings)
    assert int8_file != fp32_file
    low, mean, overlap = check_int8(settings, fp32_file, int8_file)
    assert 0.5 < low <= mean < 1.0 and 0.0 <= overlap <= 1.0
    with pytest.raises(ConfigError, match=r"int8 refused.*min row cosine .*mean .*--min-quant-cosine 1\.0"):
        check_int8(dataclasses.replace(settings, min_quant_cosine=1.0), fp32_file, int8_file)


def test_neighbour_overlap_is_one_for_identical_rows_and_less_for_shuffled_ones():
    rows = np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32)
    assert neighbour_overlap(rows, rows) == 1.0
    assert neighbour_overlap(rows, rows[np.random.default_rng(1).permutation(30)]) < 0.9
    assert neighbour_overlap(rows[:3], rows[:3], k=10) == 1.0  # k capped at len - 1


def test_int8_embeddings_stay_close_to_fp32(tiny_model):
    fp32 = embed(settings_for(tiny_model, "onnx"))
    int8 = embed(settings_for(tiny_model, "onnx", quantize="int8", min_quant_cosine=0.5))
    assert row_cosine(fp32, int8).min() > 0.9
    assert not np.array_equal(fp32, int8)


def test_server_refuses_int8_that_fails_its_check(tiny_model, tmp_path):
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "encoder_server.cli", "start", "--model", str(tiny_model),
                             "--quantize", "int8", "--min-quant-cosine", "1.0", "--port", "0", "--port-out", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "int8 refused" in result.stderr and "mean" in result.stderr


def test_server_serves_int8_when_it_passes(tiny_model, tmp_path):
    texts = random_texts(40, seed=3)
    with running_server(tiny_model, "--quantize", "int8", "--min-quant-cosine", "0.5", "--num-worker", "1",
                        tmp_path=tmp_path) as server, server.client() as client:
        served = client.encode(texts)
        assert "int8 vs fp32" in server.log
    assert row_cosine(served, embed(settings_for(tiny_model, "onnx"), texts)).min() > 0.9


@pytest.mark.parametrize("choices, message", [
    ({"backend": "torch", "quantize": "int8"}, "--quantize int8 needs --backend onnx"),
    ({"min_quant_cosine": 1.5}, "--min-quant-cosine must be in"),
    ({"batch_wait_ms": -1}, "--batch-wait-ms must not be negative"),
])
def test_engine_choices_that_cannot_work_are_refused(tiny_model, choices, message):
    with pytest.raises(ConfigError, match=message):
        resolve(model=str(tiny_model), **choices)


def test_smoothing_alone_leaves_the_fp32_output_unchanged(tiny_model, tmp_path):
    import onnx

    from encoder_server.model import onnx_export
    from encoder_server.model.smoothing import activation_maxima, smooth, weight_matmuls

    settings = settings_for(tiny_model, "onnx")
    fp32_file, _ = onnx_files(settings)
    model = onnx.load(str(fp32_file))
    matmuls = weight_matmuls(model.graph)
    maxima = activation_maxima(fp32_file, settings, set(matmuls.values()))
    smooth(model.graph, maxima, set(matmuls), alpha=0.5, floor=0.5)
    assert sum(node.op_type == "Mul" and node.name.endswith("/smooth") for node in model.graph.node) > 0
    smoothed = tmp_path / "smoothed.onnx"
    onnx.save(model, str(smoothed))
    onnx_export.move_weights_out(smoothed)
    expected = embed(settings)
    actual = embed(dataclasses.replace(settings, onnx_file=str(smoothed)))
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)


def test_a_session_of_several_threads_leaves_the_cores_once_its_pass_is_done(tiny_model):
    """Its idle threads spin only briefly: the CPU time this process spends while it sleeps after a
    pass stays near zero (ONNX Runtime's default spin took about 40 ms of it after each pass)."""
    settings = settings_for(tiny_model, "onnx")
    encoding = Embedder(settings).tokenize(TEXTS[:8])
    (_, inputs), *_ = plan_passes(encoding, settings.max_batch_tokens, settings.max_batch_size)
    backend = OnnxBackend(settings, threads=2)
    backend.run(inputs)
    spent = []
    for _ in range(5):
        backend.run(inputs)
        before = time.process_time()
        time.sleep(0.2)
        spent.append(time.process_time() - before)
    assert statistics.median(spent) < 0.005, f"CPU seconds spent while idle after each pass: {spent}"
