"""PyTorch backend: the model's torch module (the pooled encoder, or a reranker's scoring model) run in torch."""
import torch

from .pooled_model import load_model_module


class TorchBackend:
    def __init__(self, spec):
        if spec.device == "cpu":
            torch.set_num_threads(spec.threads_per_worker)
        self.device = torch.device(spec.device)
        model = load_model_module(spec).to(self.device)
        if spec.fp16:
            model.model.half()  # the encoder only: pooling and the head stay float32
        self.model = model

    def run(self, inputs):
        with torch.inference_mode():
            output = self.model(*(self._tensor(getattr(inputs, name)) for name in self.model.input_names))
            return output.float().cpu().numpy()

    def _tensor(self, array):
        return torch.from_numpy(array).to(self.device, non_blocking=True)
