"""PyTorch backend: the pooled encoder run in torch."""
import torch

from .pooled_model import load_pooled_encoder


class TorchBackend:
    def __init__(self, spec):
        if spec.device == "cpu":
            torch.set_num_threads(spec.threads_per_worker)
        self.device = torch.device(spec.device)
        model = load_pooled_encoder(spec).to(self.device)
        if spec.fp16:
            model.model.half()  # the encoder only: pooling and the head stay float32
        self.model = model

    def run(self, inputs):
        with torch.inference_mode():
            pooled = self.model(self._tensor(inputs.input_ids), self._tensor(inputs.attention_mask),
                                self._tensor(inputs.pool_mask))
            return pooled.float().cpu().numpy()

    def _tensor(self, array):
        return torch.from_numpy(array).to(self.device, non_blocking=True)
