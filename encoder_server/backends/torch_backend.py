"""PyTorch backend: the pooled encoder run in torch."""
import torch

from ..arrays import pad_token_axis
from .pooled_model import load_pooled_encoder


class TorchBackend:
    def __init__(self, settings):
        if settings.device == "cpu":
            torch.set_num_threads(settings.threads_per_worker)
        self.pad_tokens_to = settings.max_seq_len if settings.pooling.token_level else None
        self.device = torch.device(settings.device)
        model = load_pooled_encoder(settings).to(self.device)
        if settings.fp16:
            model.model.half()  # the encoder only: pooling and the head stay float32
        self.model = model

    def run(self, inputs):
        with torch.inference_mode():
            pooled = self.model(self._tensor(inputs.input_ids), self._tensor(inputs.attention_mask),
                                self._tensor(inputs.pool_mask))
            result = pooled.float().cpu().numpy()
        return pad_token_axis(result, self.pad_tokens_to, axis=1) if self.pad_tokens_to else result

    def _tensor(self, array):
        return torch.from_numpy(array).to(self.device, non_blocking=True)
