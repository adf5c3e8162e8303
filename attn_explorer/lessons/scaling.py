"""Lesson "Why divide by √d_k": random queries and keys, as the key size d_k grows.

A dot product of two random d_k-long vectors (each number with spread 1) has spread √d_k. Without the
1/√d_k factor, the scores fed to the softmax spread further apart as d_k grows: the softmax puts almost
all weight on one key (its entropy falls toward 0) and its gradient vanishes. With the factor, the
spread stays near 1 at every d_k.

The attention weights come from core's `scaled_dot_product_attention` (scale=None: 1/√d_k from
`attention_scale`; scale=1: no scaling). That function is inference-only (its softmax runs in place),
so the gradient is taken by torch autograd through `torch.softmax` of the same scores; the weights of
both paths are checked to agree.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attn_explorer.core.attention import attention_scale, scaled_dot_product_attention
from attn_explorer.errors import UserError
from attn_explorer.maths import entropy_bits

DIMS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]  # d_k on the x axis


@dataclass
class Curve:
    """One measure at each d_k, with and without the 1/√d_k scale."""

    scaled: np.ndarray
    unscaled: np.ndarray


@dataclass
class ScalingCurves:
    dims: np.ndarray  # d_k values
    num_keys: int  # keys each query chooses among (entropy is at most log2 of it)
    num_queries: int  # queries averaged over
    seed: int
    spread: Curve  # std of the scores fed to the softmax
    entropy: Curve  # mean softmax entropy, bits
    gradient: Curve  # median over queries of |d loss / d scores| (one query's softmax gradient)
    weights_agree: float  # max |core weights - autograd-path weights| over every d_k (a self-check)

    @property
    def max_entropy(self) -> float:
        return float(np.log2(self.num_keys))


def softmax_gradient(scores: torch.Tensor, upstream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, |d loss/d scores| per row) for loss = sum(softmax(scores) * upstream), by autograd."""
    s = scores.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        p = torch.softmax(s, dim=-1)
        (p * upstream).sum().backward()
    return p.detach(), s.grad.norm(dim=-1)


def scaling_curves(dims: list[int] | None = None, num_keys: int = 16, num_queries: int = 256,
                   seed: int = 0) -> ScalingCurves:
    """Spread, entropy and gradient size of the softmax at each d_k, with and without 1/√d_k."""
    dims = list(DIMS if dims is None else dims)
    if not 2 <= num_keys <= 4096 or not 1 <= num_queries <= 4096 or any(d < 1 or d > 8192 for d in dims):
        raise UserError("keys must be 2..4096, queries 1..4096 and d_k 1..8192")
    g = torch.Generator().manual_seed(int(seed))
    out = {k: ([], []) for k in ("spread", "entropy", "gradient")}
    agree = 0.0
    for d in dims:
        q = torch.randn(num_queries, d, generator=g)
        k = torch.randn(num_keys, d, generator=g)
        v = torch.randn(num_keys, 1, generator=g)
        upstream = torch.randn(num_queries, num_keys, generator=g)  # how the loss depends on each weight
        for i, scale in enumerate((None, 1.0)):  # 0: scaled by 1/sqrt(d_k); 1: not scaled
            _, probs = scaled_dot_product_attention(q, k, v, scale=scale)
            scores = (q @ k.T) * attention_scale(d, scale=scale)  # what core's softmax saw
            p, grad = softmax_gradient(scores, upstream)
            agree = max(agree, float((p - probs).abs().max()))
            out["spread"][i].append(float(scores.std()))
            out["entropy"][i].append(float(entropy_bits(probs.numpy()).mean()))
            out["gradient"][i].append(float(grad.median()))
    curves = {k: Curve(np.array(a), np.array(b)) for k, (a, b) in out.items()}
    return ScalingCurves(np.array(dims), num_keys, num_queries, int(seed), curves["spread"], curves["entropy"],
                         curves["gradient"], agree)


def loglog_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Slope of log y against log x (0.5 means y grows like √x)."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])
