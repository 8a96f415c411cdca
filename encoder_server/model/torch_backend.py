"""PyTorch backend: the model's torch module (the pooled encoder, or a reranker's scoring model) run in torch."""
import torch

from .pooled_model import load_model_module


class TorchBackend:
    def __init__(self, spec):
        if spec.device == "cpu":
            torch.set_num_threads(spec.threads_per_worker)
        self.device = torch.device(spec.device)
        if self.device.type == "cuda":
            without_per_shape_attention_plans()
        self.model = load_on_device(spec)

    def run(self, inputs):
        with torch.inference_mode():
            output = self.model(*(self._tensor(getattr(inputs, name)) for name in self.model.input_names))
            return output.float().cpu().numpy()

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
    new shape of its inputs, cached by batch and length: tens of ms of host time each on an sm90 in
    others' measurements, 0.4 s on an sm100. A server's passes, of every row count and length,
    rarely repeat a shape. fp32 never runs on that kernel, which would explain why only --fp16 was
    slow on an H200 (issue 31; benchmark/cuda_passes.py measures passes of unseen shapes with and
    without it). Memory-efficient attention serves instead and needs no plan."""
    torch.backends.cuda.enable_cudnn_sdp(False)
