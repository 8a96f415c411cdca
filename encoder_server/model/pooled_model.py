"""The encoder, its pooling and the model's head (sentence-transformers Dense and LayerNorm modules)
as one torch module: run directly by the torch backend, exported to ONNX by the onnx backend, so
both compute exactly the same function. Normalization is not part of it: each request may choose."""
import logging
from pathlib import Path

import torch
from transformers import AutoModel

from .model_folder import WEIGHT_FILES
from .pooling import pool
from .spec import RERANK, SPARSE

log = logging.getLogger(__name__)
_LAYER_LISTS = ("encoder.layer", "transformer.layer", "encoder.layers", "layers")
INPUT_NAMES = ("input_ids", "attention_mask", "pool_mask")


class PooledEncoder(torch.nn.Module):
    """(input_ids, attention_mask, pool_mask) -> pooled float32 embeddings, through the head."""

    input_names = INPUT_NAMES

    def __init__(self, model, layers, strategy, head=()):
        super().__init__()
        self.model, self.layers, self.strategy = model, layers, strategy
        self.head = torch.nn.Sequential(*head)

    def forward(self, input_ids, attention_mask, pool_mask):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return self.head(pool(outputs.hidden_states, self.layers, self.strategy, attention_mask, pool_mask))


class Dense(torch.nn.Module):
    """sentence-transformers' Dense module (its parameter names, so its weights load as saved)."""

    def __init__(self, layer, weights):
        super().__init__()
        self.linear = torch.nn.Linear(layer.in_features, layer.out_features, bias="linear.bias" in weights)
        self.activation_function = _torch_module(layer.activation)

    def forward(self, features):
        return self.activation_function(self.linear(features))


class LayerNorm(torch.nn.Module):
    def __init__(self, layer, weights):
        super().__init__()
        self.norm = torch.nn.LayerNorm(layer.in_features)

    def forward(self, features):
        return self.norm(features)


def load_head(layers):
    """The torch modules of model_folder.HeadLayer descriptions, with their saved weights."""
    modules = []
    for layer in layers:
        weights = _weights(layer.folder)
        module = {"Dense": Dense, "LayerNorm": LayerNorm}[layer.kind](layer, weights)
        module.load_state_dict(weights)
        modules.append(module.float().eval())
    return modules


def _weights(folder):
    path = next(Path(folder) / name for name in WEIGHT_FILES if (Path(folder) / name).is_file())
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def _torch_module(dotted):
    """An instance of the torch.nn module class named `dotted` (model_folder checked the prefix)."""
    from importlib import import_module
    module_name, _, class_name = dotted.rpartition(".")
    cls = getattr(import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ValueError(f"{dotted} is not a torch.nn module")
    return cls()


def load_model_module(spec, attention=None):
    """The torch module a spec serves: a reranker's scoring model, a sparse model's SPLADE model or
    the pooled encoder; its `input_names` say which of a Pass's arrays it takes, in order."""
    if spec.kind == RERANK:
        from .cross_encoder import load_scoring_model
        return load_scoring_model(spec, attention)
    if spec.kind == SPARSE:
        from .splade import load_splade_model
        return load_splade_model(spec, attention)
    return load_pooled_encoder(spec, attention)


def load_pooled_encoder(spec, attention=None):
    """The model pruned to the highest layer that pooling needs, in eval mode, on the CPU.

    By default transformers picks the attention (SDPA where the architecture has it, eager for
    MPNet and others); `attention="eager"` gives the plain MatMul-Softmax graph that ONNX Runtime's
    fusions recognise.
    """
    # hidden_states[0] is the embedding output, hidden_states[i] the output of layer i
    layers = [layer % (spec.num_layers + 1) for layer in spec.pooling.layers]
    model = AutoModel.from_pretrained(spec.encoder_path, attn_implementation=attention)
    prune_layers(model, max(layers))
    return PooledEncoder(model, layers, spec.pooling_strategy, load_head(spec.head)).eval()


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
