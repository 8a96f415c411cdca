"""The encoder and its pooling as one torch module: run directly by the torch backend, exported
to ONNX by the onnx backend, so both compute exactly the same function."""
import logging

import torch
from transformers import AutoModel

from .pooling import pool

log = logging.getLogger(__name__)
_LAYER_LISTS = ("encoder.layer", "transformer.layer", "encoder.layers", "layers")
INPUT_NAMES = ("input_ids", "attention_mask", "special_tokens_mask")


class PooledEncoder(torch.nn.Module):
    """(input_ids, attention_mask, special_tokens_mask) -> pooled float32 embeddings."""

    def __init__(self, model, layers, spec):
        super().__init__()
        self.model, self.layers, self.spec = model, layers, spec

    def forward(self, input_ids, attention_mask, special_tokens_mask):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        special = special_tokens_mask if self.spec.mask_cls_sep else None
        return pool(outputs.hidden_states, self.layers, self.spec.strategy, attention_mask, special,
                    self.spec.normalize)


def load_pooled_encoder(settings, attention="sdpa"):
    """The model pruned to the highest layer that pooling needs, in eval mode, on the CPU.

    `attention="eager"` gives the plain MatMul-Softmax graph that ONNX Runtime's fusions recognise.
    """
    # hidden_states[0] is the embedding output, hidden_states[i] the output of layer i
    layers = [layer % (settings.num_layers + 1) for layer in settings.pooling.layers]
    model = AutoModel.from_pretrained(settings.model, attn_implementation=attention)
    prune_layers(model, max(layers))
    return PooledEncoder(model, layers, settings.pooling).eval()


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
