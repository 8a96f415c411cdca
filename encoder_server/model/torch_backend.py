"""PyTorch backend: the model's torch module (the pooled encoder, or a reranker's scoring model) run in torch."""
import torch

from .host_copy import to_host
from .pooled_model import load_model_module


class TorchBackend:
    def __init__(self, spec):
        if spec.device == "cpu":
            torch.set_num_threads(spec.threads_per_worker)
        self.device = torch.device(spec.device)
        if self.device.type == "cuda":
            without_per_shape_attention_plans()
        self.model = load_on_device(spec)
        self.graphed = None
        if spec.cuda_graphs:
            from .cuda_graphs import GraphedModel
            self.graphed = GraphedModel(self.model, self.device, spec.max_batch_tokens)

    def run(self, inputs):
        return self.graphed.run(inputs, self.run_eagerly) if self.graphed else self.run_eagerly(inputs)

    def run_eagerly(self, inputs):
        with torch.inference_mode():
            output = self.model(*(self._tensor(getattr(inputs, name)) for name in self.model.input_names))
            return to_host(output)

    def _tensor(self, array):
        return torch.from_numpy(array).to(self.device, non_blocking=True)


def load_on_device(spec, attention=None):
    """The model's torch module on spec.device, its encoder halved with --fp16 (pooling and the head
    stay float32); `attention` as load_model_module takes it."""
    model = load_model_module(spec, attention=attention).to(spec.device)
    if spec.fp16:
        model.model.half()
    return model


def without_per_shape_attention_plans():
    """Keep torch's attention off cuDNN's kernel in this process. Recent torch puts it first for fp16
    and bf16 on sm90 and sm100 GPUs (H100, H200, B200), and it builds an execution graph for each
    new shape of its inputs; a server's passes, of every row count and length, rarely repeat a shape.
    It made --fp16 3x slower than fp32 on an H200: fp16 passes of unseen shapes ran 445 medium texts/s
    with it, 7,604 without (issue 31, benchmark/cuda_passes.py). fp32 never runs on that kernel.
    Memory-efficient attention serves instead and needs no plan."""
    torch.backends.cuda.enable_cudnn_sdp(False)
