"""benchmark/device_kit.py: the bundled model travels to a GPU machine with its weights in fp16 and
comes back to fp32 there, each value the fp16 rounding of the original (the wheels need PyPI and
CPython 3.12, so they are left out here)."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmark import device_kit
from conftest import random_texts
from encoder_server.model import load
from encoder_server.model.model_folder import default_model_path


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    kit = tmp_path_factory.mktemp("kit")
    size = device_kit.pack(kit, wheels=False)
    return kit, size


def test_the_packed_model_fits_in_what_travels_with_its_floats_in_fp16(kit):
    kit, size = kit
    original = load_file(default_model_path() / "model.safetensors")
    original_size = (default_model_path() / "model.safetensors").stat().st_size
    assert original_size > device_kit.LIMIT > size and size < 0.52 * original_size
    packed = load_file(kit / "model" / "model.safetensors")
    assert packed.keys() == original.keys()
    for name, tensor in original.items():
        assert packed[name].dtype == (torch.float16 if tensor.is_floating_point() else tensor.dtype), name
    assert any(not tensor.is_floating_point() for tensor in original.values())  # position_ids: int64, untouched


def test_unpacked_weights_are_the_originals_rounded_to_fp16_and_embed_alike(kit):
    kit, _ = kit
    device_kit.unpack(kit)
    widened_file = kit / "model" / "model.safetensors"
    unpacked_once = widened_file.read_bytes()
    device_kit.unpack(kit)  # again: nothing left to widen
    assert widened_file.read_bytes() == unpacked_once
    original, widened = load_file(default_model_path() / "model.safetensors"), load_file(widened_file)
    for name, tensor in original.items():
        expected = tensor.half().to(tensor.dtype) if tensor.is_floating_point() else tensor
        assert widened[name].dtype == tensor.dtype and torch.equal(widened[name], expected), name
    texts = random_texts(16, seed=31)
    rows = load(str(kit / "model"), threads_per_worker=1).embed_texts(texts)
    reference = load(str(default_model_path()), threads_per_worker=1).embed_texts(texts)
    cosines = np.sum(rows * reference, axis=1)  # both normalized
    assert cosines.min() > 0.9999 and not np.array_equal(rows, reference)


def test_a_value_past_fp16s_range_is_refused(tmp_path):
    save_file({"weight": torch.tensor([1.0, 1e6])}, tmp_path / "big.safetensors")
    with pytest.raises(ValueError, match="past fp16's range"):
        device_kit.narrow(tmp_path / "big.safetensors", tmp_path / "narrow.safetensors")
