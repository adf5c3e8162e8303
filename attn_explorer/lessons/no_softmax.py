"""Lesson "Attention without a softmax": the primer's sentence through one softmax head and one Gated DeltaNet
head, side by side, on the same queries, keys and values.

A tiny random model (seeded, untrained: its patterns mean nothing, the mechanics are real): each word's fixed
vector (core.textbook.word_vector, DIM numbers) times seeded projections gives q, k and v, shared by both heads.
- The softmax head: core.attention.scaled_dot_product_attention, causal. Its map is probabilities.
- The DeltaNet head: q and k L2-normalised (q also ÷√d_k, as Qwen3.5 does), a write strength β_t from the token
  (sigmoid of a projection; or one value for all) and a decay g per token (the slider). Its output is
  core.deltanet.chunked_delta_rule (the layer's own chunked form) and its map core.deltanet.implicit_map: the
  A with output_t = Σ_s A[t, s] v_s, signed, rows not summing to 1. The lesson checks A @ V = the output.
The decay: how much of the last query's row survives at distance t - s, against the envelope decay^(t-s).
The cost: the recurrence keeps a d_k × d_v state (O(n·d²) work, memory flat in n) where softmax keeps n keys and
values (O(n²·d)); the implicit map is still n × n, which is why the explorer only draws it, tile by tile.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attn_explorer.core.attention import scaled_dot_product_attention
from attn_explorer.core.deltanet import chunked_delta_rule, implicit_map
from attn_explorer.core.textbook import split_words, word_vector
from attn_explorer.errors import UserError

PRIMER_SENTENCE = "The animal didn't cross the street because it was too tired."
DIM = 16  # word vectors and head size
MAX_TOKENS = 48
COST_N = (1_024, 8_192, 32_768, 131_072)  # lengths in the cost table
COST_D = 128  # a real head's d_k = d_v (Qwen3.5's DeltaNet and attention heads)


@dataclass
class Comparison:
    tokens: list[str]
    softmax: np.ndarray  # (n, n) probabilities, causal
    deltanet: np.ndarray  # (n, n) the implicit map A, signed
    beta: np.ndarray  # (n,) the write strength of each token
    decay: float  # kept per token (e^g)
    seed: int
    reproduces: float  # max |A @ V - the delta rule's output| (the map is exact)
    distance: np.ndarray  # (n,) t - s for the last query's row
    last_row: np.ndarray  # (n,) |A[n-1, s]| ÷ |q_{n-1}| ordered by distance 0..n-1: at most β_s · envelope
    envelope: np.ndarray  # (n,) decay ** distance
    row_sums: np.ndarray  # (n,) Σ_s A[t, s] (1 for every softmax row; anything here)
    negative: float  # the share of the map's weight (Σ|A|) that is negative


@dataclass
class CostRow:
    n: int
    softmax_flops: float  # per head: scores and weighted sum, 2·n²·d multiply-adds over the whole input
    softmax_memory: float  # numbers kept for the next token: n keys and n values of d
    recurrent_flops: float  # per head: ~4·d² per token (decay, read k·S, rank-1 write, read q·S)
    recurrent_memory: float  # the d × d state, whatever n is
    map_cells: float  # the implicit map's cells to draw (n(n+1)/2 below the diagonal)


def tokens_of(text: str) -> list[str]:
    words = split_words(text)
    if not words:
        raise UserError("type a sentence: the lesson needs at least one word")
    if len(words) > MAX_TOKENS:
        raise UserError(f"at most {MAX_TOKENS} words here ({len(words)} given): the maps must stay readable")
    return words


def compare(text: str = PRIMER_SENTENCE, decay: float = 0.9, beta: float | None = None, seed: int = 0
            ) -> Comparison:
    """The sentence through both heads. decay in (0, 1] (kept per token); beta None: from each token, else that
    one value in (0, 1]."""
    if not 0.0 < decay <= 1.0:
        raise UserError(f"decay must be in (0, 1], not {decay}")
    if beta is not None and not 0.0 < beta <= 1.0:
        raise UserError(f"β must be in (0, 1], not {beta}")
    words = tokens_of(text)
    n = len(words)
    gen = torch.Generator().manual_seed(seed)
    x = torch.stack([word_vector(w, DIM) for w in words]).double()  # (n, DIM)
    w_q, w_k, w_v = (torch.randn(DIM, DIM, generator=gen, dtype=torch.float64) / DIM ** 0.5 for _ in range(3))
    w_b = torch.randn(DIM, generator=gen, dtype=torch.float64) / DIM ** 0.5
    q, k, v = ((x @ w)[None, None] for w in (w_q, w_k, w_v))  # (1, 1, n, DIM)
    with torch.no_grad():
        _, probs = scaled_dot_product_attention(q, k, v, causal=True)
        qn = F.normalize(q, dim=-1) / DIM ** 0.5
        kn = F.normalize(k, dim=-1)
        b = torch.sigmoid(x @ w_b) if beta is None else torch.full((n,), float(beta), dtype=torch.float64)
        b = b[None, None]
        g = torch.full((1, 1, n), float(np.log(decay)), dtype=torch.float64)
        out, _ = chunked_delta_rule(qn, kn, v, g, b, chunk=16)
        a = implicit_map(qn, kn, g, b, chunk=16)
    A = a[0, 0].numpy()
    reproduces = float((a @ v - out).abs().max())
    dist = np.arange(n)
    # |A[t, s]| = β_s |k_sᵀ P(s, t) q_t| <= β_s · decay^(t-s) · |q_t|: |k_s| = 1 and each factor (I - β k kᵀ) of P
    # has norm <= 1 (core.recurrent's derivation), so divided by |q_t| the row sits under β_s · decay^(t-s)
    last = np.abs(A[n - 1, ::-1]) / float(qn[0, 0, n - 1].norm())  # distance 0 (itself) first
    total = float(np.abs(A).sum())
    return Comparison(words, probs[0, 0].numpy(), A, b[0, 0].numpy(), float(decay), seed, reproduces, dist, last,
                      float(decay) ** dist.astype(float), A.sum(-1),
                      float(np.abs(np.minimum(A, 0)).sum() / total) if total > 0 else 0.0)


def cost_table(d: int = COST_D, lengths: tuple[int, ...] = COST_N) -> list[CostRow]:
    """Per head, the work and the memory of softmax attention and of a d_k × d_v recurrence at each length."""
    return [CostRow(n, 2.0 * n * n * d, 2.0 * n * d, 4.0 * n * d * d, float(d * d), n * (n + 1) / 2.0)
            for n in lengths]
