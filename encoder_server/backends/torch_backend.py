"""PyTorch backend: the encoder pruned to the highest layer that pooling needs."""
import logging

import torch
from transformers import AutoModel

from ..arrays import pad_token_axis
from ..pooling import pool

log = logging.getLogger(__name__)
_LAYER_LISTS = ("encoder.layer", "transformer.layer", "encoder.layers", "layers")


class TorchEncoder:
    def __init__(self, settings):
        if settings.device == "cpu":
            torch.set_num_threads(settings.threads_per_worker)
        self.spec = settings.pooling
        self.pad_tokens_to = settings.max_seq_len if self.spec.strategy == "none" else None
        self.device = torch.device(settings.device)
        # hidden_states[0] is the embedding output, hidden_states[i] the output of layer i
        self.layers = [layer % (settings.num_layers + 1) for layer in self.spec.layers]
        model = AutoModel.from_pretrained(settings.model)
        prune_layers(model, max(self.layers))
        model = model.eval().to(self.device)
        self.model = model.half() if settings.fp16 else model

    def embed(self, batch):
        with torch.inference_mode():
            attention_mask = self._tensor(batch.attention_mask)
            outputs = self.model(input_ids=self._tensor(batch.input_ids), attention_mask=attention_mask,
                                 output_hidden_states=True)
            special = self._tensor(batch.special_tokens_mask) if self.spec.mask_cls_sep else None
            pooled = pool(outputs.hidden_states, self.layers, self.spec.strategy, attention_mask, special,
                          self.spec.normalize)
            result = pooled.float().cpu().numpy()
        return pad_token_axis(result, self.pad_tokens_to, axis=1) if self.pad_tokens_to else result

    def _tensor(self, array):
        return torch.from_numpy(array).to(self.device, non_blocking=True)


def prune_layers(model, keep):
    """Drop every encoder layer above `keep`, so they are never computed."""
    for path in _LAYER_LISTS:
        parent_path, _, name = path.rpartition(".")
        parent = _attribute(model, parent_path)
        layers = getattr(parent, name, None) if parent is not None else None
        if isinstance(layers, torch.nn.ModuleList):
            setattr(parent, name, layers[:keep])
            model.config.num_hidden_layers = keep
            return
    log.warning("could not find the encoder's layer list; computing every layer")


def _attribute(obj, dotted):
    for part in filter(None, dotted.split(".")):
        obj = getattr(obj, part, None)
    return obj
