"""Learned attention sinks (gpt-oss): one learned logit per head joins every query row's softmax as an
extra column with no value behind it.

For query i of head h with logits s_i1..s_iM and the head's sink logit z_h:

    p_ij = exp(s_ij) / (exp(z_h) + sum_j' exp(s_ij'))      sink share_i = exp(z_h) / (same)

so the weights over the M real keys sum to 1 - sink share, and the output sum_j p_ij v_j is pulled
towards 0 by the share the sink takes. transformers' eager_attention_forward (modeling_gpt_oss.py)
concatenates the sink column to the masked logits, subtracts the row's max, takes the softmax in the
logits' dtype and drops the column; `softmax_with_sink` computes the same without building the wider
tensor. A fully masked row gives its whole weight to the sink: zeros, never NaN.

In log-sum-exp form (what lazy attention keeps): lse_i = logaddexp(lse_i over the real keys, z_h), and a
kernel's output over the real keys alone is rescaled by exp(lse_keys - lse_i) (`fold_sink`). That is how
torch's fused kernels, which know no sink, stay exact: core.attention runs them through core.lazy's
keep_attention (which returns the lse) and folds the sink in afterwards.
"""
from __future__ import annotations

import torch


def sink_column(sinks: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """sinks (H,) -> (H, 1, 1) in like's dtype and device: broadcasts against (..., H, N, M) logits."""
    return sinks.to(device=like.device, dtype=like.dtype).reshape(-1, 1, 1)


def softmax_with_sink(logits: torch.Tensor, sinks: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """The probabilities over the real keys of softmax([logits, sink]): (..., H, N, M), each row summing to
    1 - its sink share. logits: masked (-inf where a key is hidden), (..., H, N, M). inplace: computed in
    logits' own buffer (the model's stacked maps), as the explicit path does without autograd."""
    z = sink_column(sinks, logits)
    top = torch.maximum(logits.amax(dim=-1, keepdim=True), z)  # the wider row's max, as transformers subtracts
    e = logits.sub_(top).exp_() if inplace else torch.exp(logits - top)
    denom = e.sum(dim=-1, keepdim=True) + torch.exp(z - top)
    return e.div_(denom) if inplace else e / denom


def fold_sink(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the real keys alone -> the same with the sink column: out (B, H, N, d_v) and lse
    (B, H, N, float32) of the real keys (-inf for a row that sees none) -> (out · exp(lse - lse'), lse'),
    lse' = logaddexp(lse, sink). The sink's value is zero, so the output only shrinks by the sink's share."""
    lse_all = torch.logaddexp(lse, sink_column(sinks, lse)[..., 0])
    keep = torch.exp(lse - lse_all)  # 1 - the sink's share; 0 on a row that sees only the sink
    return out * keep[..., None].to(out.dtype), lse_all


def sink_share(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Each row's sink share exp(sink - lse), float32 (..., H, N), from an lse that includes the sink."""
    return torch.exp(sink_column(sinks, lse.float())[..., 0] - lse.float())
