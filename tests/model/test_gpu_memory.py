"""encoder_server.model.gpu_memory: what a CUDA worker of a model holds, read from real model folders,
and how many such workers a GPU's memory takes."""
import json
import struct
from dataclasses import replace

import pytest

from encoder_server.model.cuda_graphs import OUTPUT_BYTES
from encoder_server.model.gpu_memory import CONTEXT_BYTES, parameter_count, worker_bytes, workers_that_fit
from encoder_server.settings import resolve

GIB = 1 << 30


@pytest.fixture(scope="module")
def tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    return transformers.BertModel(config)


@pytest.mark.parametrize("safetensors", [True, False], ids=["safetensors", "torch-bin"])
def test_the_parameter_count_is_read_from_the_saved_weights(tiny_bert, tmp_path, safetensors):
    tiny_bert.save_pretrained(tmp_path, safe_serialization=safetensors)
    expected = tiny_bert.num_parameters()
    if safetensors:  # the headers name every tensor and its shape
        assert parameter_count(tmp_path) == expected
    else:  # a .bin file is counted by its size, as fp32: within its pickle's overhead
        assert expected <= parameter_count(tmp_path) <= expected * 1.05


def test_a_safetensors_file_in_fp16_counts_its_numbers_not_its_bytes(tiny_bert, tmp_path):
    tiny_bert.half().save_pretrained(tmp_path)
    assert parameter_count(tmp_path) == tiny_bert.num_parameters()


def test_weights_that_are_no_safetensors_are_a_start_up_error_that_names_the_file(tmp_path):
    from encoder_server.model.model_folder import ConfigError
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 100)
    with pytest.raises(ConfigError, match="model.safetensors: not readable as safetensors"):
        parameter_count(tmp_path)


def big_model_folder(root, hidden=4096, layers=32, parameters=7_000_000_000):
    """A 7B-sized encoder's folder: its config, a vocabulary and a sparse fp16 safetensors file of that
    many numbers, which takes no disk."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": layers,
                                                  "hidden_size": hidden, "max_position_embeddings": 512}))
    (root / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n")
    header = json.dumps({"weight": {"dtype": "F16", "shape": [parameters], "data_offsets": [0, 2 * parameters]}})
    with open(root / "model.safetensors", "wb") as weights:
        weights.write(struct.pack("<Q", len(header)) + header.encode())
        weights.truncate(8 + len(header) + 2 * parameters)
    return root


def cuda_settings(folder, **choices):
    """The settings a cuda server would resolve, but for the device check, which needs a GPU."""
    return replace(resolve(model=str(folder)), max_batch_tokens=16384, **choices)


def test_a_small_model_leaves_the_worker_count_to_the_cpus_and_a_7b_one_gets_one_worker(tmp_path):
    small = replace(resolve(), max_batch_tokens=16384)  # the bundled model
    assert workers_that_fit(80 * GIB, worker_bytes(small)) >= 8 * 4
    big = big_model_folder(tmp_path / "big")
    assert parameter_count(big) == 7_000_000_000
    assert workers_that_fit(80 * GIB, worker_bytes(cuda_settings(big))) == 1  # 28 GB of fp32 weights alone
    assert workers_that_fit(141 * GIB, worker_bytes(cuda_settings(big, fp16=True))) == 3


def test_a_worker_holds_its_context_weights_and_activations_which_halve_in_fp16(tmp_path):
    settings = cuda_settings(big_model_folder(tmp_path / "big", parameters=1_000_000_000))
    fp32, fp16 = worker_bytes(settings), worker_bytes(replace(settings, fp16=True))
    assert fp32 > CONTEXT_BYTES + 4 * 1_000_000_000
    assert fp16 - CONTEXT_BYTES == (fp32 - CONTEXT_BYTES) // 2
    half_the_tokens = worker_bytes(replace(settings, max_batch_tokens=8192))
    assert half_the_tokens < fp32
    activations = 2 * (fp32 - half_the_tokens)  # one pass of 16384 tokens
    graphs = worker_bytes(replace(settings, cuda_graphs=True)) - fp32
    assert graphs == activations + OUTPUT_BYTES  # their pool holds a pass more, and they keep their outputs


def test_one_worker_is_started_even_where_none_fits():
    assert workers_that_fit(8 * GIB, 40 * GIB) == 1
    assert workers_that_fit(80 * GIB, 10 * GIB) == 4  # half of the GPU's memory
