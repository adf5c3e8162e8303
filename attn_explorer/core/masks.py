"""The scale and the mask of attention, each worked out in one function (core.attention, core.lazy and
core.efficient all read them from here)."""
from __future__ import annotations

import math

import torch


def key_padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, M) with 1 = a real token -> bool (B, 1, 1, M), broadcast over heads and queries."""
    return None if attention_mask is None else attention_mask.bool()[:, None, None, :]


def attention_scale(d_k: int, dk_scale: float = 1.0, scale: float | None = None) -> float:
    """The logits' factor: `scale` (1/sqrt(d_k) when None) times dk_scale."""
    return (1.0 / math.sqrt(d_k) if scale is None else float(scale)) * dk_scale


def causal_mask(n: int, m: int | None = None, device=None, window: int | None = None,
                chunk: int | None = None) -> torch.Tensor:
    """Boolean (n, m) mask, True where query i may look at key j (j <= i + m - n); with a sliding
    window also j > i + m - n - window: each query sees its last `window` keys, itself included.
    chunk (Llama 4's attention_chunk_size): the m positions fall into chunks of `chunk` from position 0,
    and query i (at position i + m - n) sees only the keys of its own chunk."""
    m = n if m is None else m
    tri = torch.ones(n, m, dtype=torch.bool, device=device).tril(diagonal=m - n)
    if window is not None:
        tri.triu_(diagonal=m - n - window + 1)
    if chunk is not None:
        first = torch.arange(m - n, m, device=device) // chunk * chunk  # each query's chunk starts here
        tri &= torch.arange(m, device=device)[None, :] >= first[:, None]
    return tri


def chunk_start(position: int, chunk: int | None) -> int:
    """The first position of `position`'s attention chunk (0 without chunks)."""
    return 0 if chunk is None else position // chunk * chunk


def fold_mask(mask: torch.Tensor | None, causal: bool, n: int, m: int, device=None,
              window: int | None = None, chunk: int | None = None) -> torch.Tensor | None:
    """One mask for n queries and m keys: `mask` (bool or additive) with the causal triangle (cut to
    the sliding window or the query's attention chunk, if any) folded in.

    A bool mask stays bool (True = may attend), an additive one stays additive (-inf = may not).
    """
    if not causal:
        if window is not None or chunk is not None:
            raise ValueError("a sliding window or attention chunks need causal attention")
        return mask
    tri = causal_mask(n, m, device, window, chunk)
    if mask is None:
        return tri
    if mask.dtype == torch.bool:
        return mask & tri
    return mask.masked_fill(~tri, float("-inf"))


def apply_mask_(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Apply a mask to scores in place: bool False -> -inf, float -> added."""
    if mask.dtype == torch.bool:
        return scores.masked_fill_(~mask, float("-inf"))
    return scores.add_(mask)


def differentiable(*tensors: torch.Tensor) -> bool:
    """Whether autograd records this step: then no buffer may be written in place."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
