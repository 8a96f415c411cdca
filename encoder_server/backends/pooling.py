"""Pooling: the strategies there are, how wide each one's output is, and one small pure function
per strategy over hidden states of shape [n, seq, dim].

This module is the one authority on strategy names and output width: the settings, the CLI and
the gateway read them here. It imports torch only when pooling runs, so they do not load it.

`mask` is a float [n, seq] tensor: 1 for tokens that count, 0 for padding (and for [CLS]/[SEP]
with mask_cls_sep). `lengths` is the number of real tokens per row, special tokens included.
"""
from dataclasses import dataclass


def mean(hidden, mask, lengths):
    summed = (hidden * mask.unsqueeze(-1)).sum(dim=1)
    return summed / mask.sum(dim=1, keepdim=True).clamp(min=1e-9)


def max_(hidden, mask, lengths):
    pooled = hidden.masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values
    return pooled.masked_fill(pooled.isinf(), 0.0)  # a row with no token that counts pools to zeros


def mean_max(hidden, mask, lengths):
    import torch
    return torch.cat([mean(hidden, mask, lengths), max_(hidden, mask, lengths)], dim=-1)


def cls(hidden, mask, lengths):
    return hidden[:, 0]


def last(hidden, mask, lengths):
    import torch
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]


def none(hidden, mask, lengths):
    return hidden * mask.unsqueeze(-1)


_POOLERS = {"mean": mean, "max": max_, "mean_max": mean_max, "cls": cls, "last": last, "none": none}
STRATEGIES = tuple(_POOLERS)
MASKABLE = ("mean", "max", "mean_max", "none")  # the strategies that --mask-cls-sep changes
TOKEN_LEVEL = "none"                             # gives [n, seq, dim]: one vector per token
_WIDTH_FACTOR = {"mean_max": 2}                  # concatenates two vectors per layer


@dataclass(frozen=True)
class PoolingSpec:
    strategy: str
    layers: tuple
    mask_cls_sep: bool = False
    normalize: bool = False

    def output_width(self, hidden_size):
        """Floats per embedding (per token for the token-level strategy)."""
        return hidden_size * len(self.layers) * _WIDTH_FACTOR.get(self.strategy, 1)

    @property
    def token_level(self):
        return self.strategy == TOKEN_LEVEL

    def describe(self):
        layers = ", ".join(str(layer) for layer in self.layers)
        extras = [name for name in ("mask_cls_sep", "normalize") if getattr(self, name)]
        return f"{self.strategy} over layer(s) {layers}" + (f" + {' + '.join(extras)}" if extras else "")


def pool(hidden_states, layers, strategy, attention_mask, special_tokens_mask=None, normalize=False):
    """Pool each chosen layer, concatenate along the feature axis, optionally L2-normalise.

    Pooling runs in float32 even for a half-precision model: fp16 cannot hold the epsilons that
    keep an all-masked row at zero instead of NaN.
    """
    import torch

    mask = attention_mask.to(torch.float32)
    if special_tokens_mask is not None:
        mask = mask * (1 - special_tokens_mask.to(mask.dtype))
    lengths = attention_mask.sum(dim=1)
    pooled = torch.cat([_POOLERS[strategy](hidden_states[layer].float(), mask, lengths) for layer in layers],
                       dim=-1)
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
    return pooled
