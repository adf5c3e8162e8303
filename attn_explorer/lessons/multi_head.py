"""Lesson "multi-head": the same 4-number tokens split over h heads, each with its own pattern.

The primer's exercise 3. With h heads each head works on d_k = 4 / h numbers of Q, K and V, so it
computes its own n×n pattern. The heads' outputs are laid side by side (Concat, n×4 again) and
mixed by W_O. Every number comes from `core.attention.MultiHeadAttention(dim=4, num_heads=h)`
holding the lesson's seeded matrices; the one-head pattern beside them uses the same W_Q, W_K, W_V.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.lessons.projections import DIM, Weights, run_heads

HEAD_CHOICES = (1, 2, 4)


@dataclass
class MultiHead:
    num_heads: int  # h
    d_k: int  # 4 // h numbers per head
    patterns: np.ndarray  # (h, n, n), each row sums to 1
    head_outputs: np.ndarray  # (h, n, d_k): each head's pattern @ its share of V
    concat: np.ndarray  # (n, 4): the heads' outputs side by side
    w_o: np.ndarray  # (4, 4)
    output: np.ndarray  # (n, 4) = concat @ W_O, the module's output
    single_pattern: np.ndarray  # (n, n): one head over all 4 numbers, same W_Q, W_K, W_V


def split_heads(x, w: Weights, num_heads: int) -> MultiHead:
    """x (n, 4) through h heads and W_O, with the one-head pattern for comparison."""
    if num_heads not in HEAD_CHOICES:
        raise UserError(f"choose 1, 2 or 4 heads (4 numbers split evenly), got {num_heads}")
    out, probs, cap = run_heads(x, w, num_heads, with_w_o=True)
    # each head's output: its pattern times its own values, (h, n, n) @ (h, n, d_k)
    heads = probs @ cap["values"]
    concat = np.concatenate(list(heads), axis=-1)  # (n, h * d_k) = (n, 4)
    _, single, _ = run_heads(x, w, 1, with_w_o=True)
    return MultiHead(num_heads=num_heads, d_k=DIM // num_heads, patterns=probs, head_outputs=heads,
                     concat=concat, w_o=w.w_o, output=out, single_pattern=single[0])
