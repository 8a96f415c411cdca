"""Pooling: one small pure function per strategy, over hidden states of shape [n, seq, dim].

`mask` is a float [n, seq] tensor: 1 for tokens that count, 0 for padding (and for [CLS]/[SEP]
with mask_cls_sep). `lengths` is the number of real tokens per row, special tokens included.
"""
import torch


def mean(hidden, mask, lengths):
    summed = (hidden * mask.unsqueeze(-1)).sum(dim=1)
    return summed / mask.sum(dim=1, keepdim=True).clamp(min=1e-9)


def max_(hidden, mask, lengths):
    masked = hidden.masked_fill(mask.unsqueeze(-1) == 0, float("-inf"))
    pooled = masked.max(dim=1).values
    return torch.where(torch.isinf(pooled), torch.zeros_like(pooled), pooled)


def mean_max(hidden, mask, lengths):
    return torch.cat([mean(hidden, mask, lengths), max_(hidden, mask, lengths)], dim=-1)


def cls(hidden, mask, lengths):
    return hidden[:, 0]


def last(hidden, mask, lengths):
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]


def none(hidden, mask, lengths):
    return hidden * mask.unsqueeze(-1)


STRATEGIES = {"mean": mean, "max": max_, "mean_max": mean_max, "cls": cls, "last": last, "none": none}


def pool(hidden_states, layers, strategy, attention_mask, special_tokens_mask=None, normalize=False):
    """Pool each chosen layer, concatenate along the feature axis, optionally L2-normalise.

    Pooling runs in float32 even for a half-precision model: fp16 cannot hold the epsilons that
    keep an all-masked row at zero instead of NaN.
    """
    mask = attention_mask.to(torch.float32)
    if special_tokens_mask is not None:
        mask = mask * (1 - special_tokens_mask.to(mask.dtype))
    lengths = attention_mask.sum(dim=1)
    pooled = torch.cat([STRATEGIES[strategy](hidden_states[layer].float(), mask, lengths) for layer in layers],
                       dim=-1)
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
    return pooled
