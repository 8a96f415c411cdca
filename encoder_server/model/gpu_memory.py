"""How many CUDA workers one GPU holds. Each worker process keeps its own CUDA context, its own copy
of the weights and the activations of one pass, so the default worker count that keeps a GPU busy
with a small model would run out of GPU memory with a large one, as the workers load.

The figures are estimates rounded up, meant to keep the default inside the GPU; `--num-worker`
overrides them.
"""
import math
from pathlib import Path

from .cuda_graphs import OUTPUT_BYTES
from .model_files import open_weights

# a CUDA context with torch's kernels loaded, cuBLAS's workspace and the caching allocator's
# rounding: a worker of a tiny model held 716 MiB on an H200 (torch 2.11, CUDA 13)
CONTEXT_BYTES = 800 << 20
# the part of the GPU's memory the default workers may plan on: the rest is left to the caching
# allocator's spare blocks, the pass that is larger than planned, and other programs on the GPU
GPU_SHARE = 0.5
# per token, in hidden widths, beside the hidden state kept from every layer (pooling may read any):
# the working set of the layer being computed, its 4x wide feed-forward intermediate and the
# attention output beside it
_KEPT_WIDTHS_PER_TOKEN = 5
_HEAD_WIDTH = 64  # BERT-family models give each attention head 64 of the hidden width


def worker_bytes(spec):
    """What one CUDA worker of `spec` (a resolved ModelSpec) holds on the GPU at its largest pass."""
    width = 2 if spec.fp16 else 4
    weights = parameter_count(spec.encoder_path) * width
    hidden = spec.hidden_size * (spec.num_layers + _KEPT_WIDTHS_PER_TOKEN)
    scores = spec.truncate_at * spec.hidden_size // _HEAD_WIDTH  # one layer's attention scores, per token
    pass_bytes = spec.max_batch_tokens * width * (hidden + scores)
    if spec.cuda_graphs:  # their memory pool beside the caching allocator's, and the outputs they keep
        return CONTEXT_BYTES + weights + 2 * pass_bytes + OUTPUT_BYTES
    return CONTEXT_BYTES + weights + pass_bytes


def parameter_count(folder):
    """The numbers in a model folder's weights, read from its safetensors headers (whatever dtype
    they are stored in, the worker loads them as fp32, or fp16 with --fp16); for torch .bin files,
    their size counted as fp32."""
    folder = Path(folder)
    if safetensors := sorted(folder.glob("*.safetensors")):
        return sum(_tensor_numbers(file) for file in safetensors)
    return sum(file.stat().st_size for file in folder.glob("*.bin")) // 4


def _tensor_numbers(file):
    with open_weights(file) as weights:
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())


def workers_that_fit(gpu_bytes, per_worker_bytes, share=GPU_SHARE):
    """Workers of `per_worker_bytes` each within `share` of a GPU's memory; at least one, since a
    single worker that does not fit fails with its own out-of-memory error."""
    return max(1, int(gpu_bytes * share) // per_worker_bytes)


def cuda_device_bytes():
    """The first visible CUDA device's memory in bytes, or None where torch is missing or sees no
    device. Only the device's properties are read: the launcher makes no tensor on the GPU."""
    try:
        import torch
        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    except (ImportError, RuntimeError, AssertionError):
        return None
