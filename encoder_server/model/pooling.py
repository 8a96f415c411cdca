"""Pooling: the strategies there are, how wide each one's output is, and one small pure function
per strategy over hidden states of shape [n, seq, dim].

This module is the one authority on strategy names and output width: the spec, the CLI and
the gateway read them here. It imports torch only when pooling runs, so they do not load it.

`mask` is a float [n, seq] tensor: 1 for tokens that count, 0 for padding (and for [CLS]/[SEP]
with mask_cls_sep, and for a prompt's tokens when the model leaves them out). `lengths` is the
number of real tokens per row, special tokens included. As in sentence-transformers 6, `cls` takes
the first token that counts (the [CLS] token unless a prompt is left out) and `last` the last real one.
"""
from dataclasses import dataclass

from encoder_client.protocol import TOKEN_LEVEL


def mean(hidden, mask, lengths):
    summed = (hidden * mask.unsqueeze(-1)).sum(dim=1)
    return summed / mask.sum(dim=1, keepdim=True).clamp(min=1e-9)


def mean_sqrt_len(hidden, mask, lengths):
    summed = (hidden * mask.unsqueeze(-1)).sum(dim=1)
    return summed / mask.sum(dim=1, keepdim=True).clamp(min=1e-9).sqrt()


def weighted_mean(hidden, mask, lengths):
    import torch
    positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=mask.dtype)
    weights = mask * positions  # later tokens weigh more (SGPT's position-weighted mean)
    summed = (hidden * weights.unsqueeze(-1)).sum(dim=1)
    return summed / weights.sum(dim=1, keepdim=True).clamp(min=1e-9)


def max_(hidden, mask, lengths):
    pooled = hidden.masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values
    return pooled.masked_fill(pooled.isinf(), 0.0)  # a row with no token that counts pools to zeros


def mean_max(hidden, mask, lengths):
    import torch
    return torch.cat([mean(hidden, mask, lengths), max_(hidden, mask, lengths)], dim=-1)


def cls(hidden, mask, lengths):
    import torch
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), mask.argmax(dim=1)]


def last(hidden, mask, lengths):
    import torch
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]


def none(hidden, mask, lengths):
    return hidden * mask.unsqueeze(-1)


_POOLERS = {"mean": mean, "max": max_, "mean_max": mean_max, "cls": cls, "last": last, TOKEN_LEVEL: none,
            "mean_sqrt_len": mean_sqrt_len, "weighted_mean": weighted_mean}
STRATEGIES = tuple(_POOLERS)
MASKABLE = ("mean", "max", "mean_max", "none", "mean_sqrt_len", "weighted_mean")  # what --mask-cls-sep changes
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


def pool(hidden_states, layers, strategy, attention_mask, pool_mask):
    """Pool each chosen layer and concatenate along the feature axis. `pool_mask` is 1 for the
    tokens that count (see the module's docstring).

    Pooling runs in float32 even for a half-precision model: fp16 cannot hold the epsilons that
    keep an all-masked row at zero instead of NaN.
    """
    import torch

    mask = pool_mask.to(torch.float32)
    lengths = attention_mask.sum(dim=1)
    return torch.cat([_POOLERS[strategy](hidden_states[layer].float(), mask, lengths) for layer in layers], dim=-1)
