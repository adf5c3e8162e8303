"""Lesson "projections": Q = X W_Q, K = X W_K, V = X W_V, then attention, with every shape written out.

The primer's exercise 2. X holds a few 4-number token vectors (one row per token); W_Q, W_K and W_V
are seeded random 4×4 matrices. The numbers come from `core.attention.MultiHeadAttention` with one
head, loaded with exactly these matrices and with W_O set to the identity, so its output is the
attention's own output softmax(Q Kᵀ / sqrt(d_k)) V: n rows of 4 numbers, the input's shape.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attn_explorer.core.attention import AttentionOptions, MultiHeadAttention
from attn_explorer.core.hooks import Hooks
from attn_explorer.core.textbook import split_words, word_vector
from attn_explorer.errors import UserError

DIM = 4  # every token vector has 4 numbers
DEFAULT_WORDS = "the cat sat down"
MAX_TOKENS = 12


@dataclass
class Weights:
    """Seeded random projections, each (DIM, DIM), used as x @ W (row vectors, as in the primer)."""

    seed: int
    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    w_o: np.ndarray  # the multi-head lesson's output projection


@dataclass
class Projected:
    """What one head does to X (n tokens): Q, K, V, the n×n pattern and the output."""

    x: np.ndarray  # (n, DIM)
    q: np.ndarray  # (n, d_k) = X W_Q
    k: np.ndarray  # (n, d_k) = X W_K
    v: np.ndarray  # (n, d_k) = X W_V
    pattern: np.ndarray  # (n, n) softmax(Q Kᵀ / sqrt(d_k)), each row sums to 1
    output: np.ndarray  # (n, d_k) pattern @ V


def random_weights(seed: int, dim: int = DIM) -> Weights:
    """W_Q, W_K, W_V, W_O drawn from a generator seeded by `seed`, scaled by 1/sqrt(dim) as in training."""
    g = torch.Generator().manual_seed(int(seed))
    w = torch.randn(4, dim, dim, generator=g, dtype=torch.float64) / dim ** 0.5
    return Weights(int(seed), *(w[i].numpy() for i in range(4)))


def word_vectors(text: str, dim: int = DIM) -> tuple[list[str], np.ndarray]:
    """Each word's fixed random vector (the textbook model's, seeded by the word), rounded to 2 places."""
    words = split_words(text)
    if not words:
        raise UserError("type a few words")
    if len(words) > MAX_TOKENS:
        raise UserError(f"at most {MAX_TOKENS} words here, got {len(words)}")
    x = torch.stack([word_vector(w, dim) for w in words]).double().numpy()
    return words, np.round(x, 2)


def head_module(w_q, w_k, w_v, w_o=None, num_heads: int = 1) -> MultiHeadAttention:
    """core's MultiHeadAttention (no biases) holding these matrices. x @ W is Linear with weight Wᵀ."""
    dim = np.asarray(w_q).shape[0]
    m = MultiHeadAttention(dim, num_heads, qkv_bias=False, out_bias=False).double().eval()
    w_o = np.eye(dim) if w_o is None else w_o
    with torch.no_grad():
        for lin, w in ((m.query, w_q), (m.key, w_k), (m.value, w_v), (m.out, w_o)):
            lin.weight.copy_(torch.as_tensor(np.asarray(w, dtype=np.float64)).T)
    return m


def run_heads(x, w: Weights, num_heads: int, with_w_o: bool) -> tuple[np.ndarray, np.ndarray, dict]:
    """x (n, DIM) through core's MultiHeadAttention. Returns (output (n, DIM), probs (H, n, n), capture
    as NumPy: q, k, values (H, n, d_k) each)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != w.w_q.shape[0]:
        raise UserError(f"each token needs {w.w_q.shape[0]} numbers")
    if x.shape[0] == 0:
        raise UserError("give at least one token")
    m = head_module(w.w_q, w.w_k, w.w_v, w.w_o if with_w_o else None, num_heads)
    kept: dict = {}
    keep = (lambda t, name: kept.__setitem__(name.rsplit("_", 1)[1], t.transpose(1, 2)[0].numpy()))  # (H, n, d_k)
    hooks = Hooks({f"blocks.0.attn.hook_{p}": (keep,) for p in "qkv"})
    with torch.inference_mode():
        out, probs = m(torch.as_tensor(x)[None], AttentionOptions(need_weights=True, hooks=hooks.layer(0)))
    return out[0].numpy(), probs[0].numpy(), {"q": kept["q"], "k": kept["k"], "values": kept["v"]}


def project(x, w: Weights) -> Projected:
    """One head on X: Q, K, V as the module computed them, its pattern and its output (W_O = identity)."""
    out, probs, cap = run_heads(x, w, 1, with_w_o=False)
    return Projected(x=np.asarray(x, dtype=np.float64), q=cap["q"][0], k=cap["k"][0], v=cap["values"][0],
                     pattern=probs[0], output=out)
