"""Lesson "by-hand": one query, a few keys and values, every step of attention as numbers.

The primer's exercise 1: for q = [2, 0] and keys [2, 0], [0, 3], [1, 1] the dot products are
4, 0 and 2; divided by sqrt(d_k) = sqrt(2), put through softmax, they give weights that sum to 1.
The weights and the output come from `core.attention.scaled_dot_product_attention` itself; the
intermediate steps (the scores, exp, the sum) are shown beside them so a learner can follow.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import numpy as np
import torch

from attn_explorer.core.attention import attention_scale, scaled_dot_product_attention
from attn_explorer.errors import UserError

# The primer's numbers.
DEFAULT_QUERY = [[2.0, 0.0]]
DEFAULT_KEYS = [[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]]
DEFAULT_VALUES = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
EXP_SHIFT_ABOVE = 50.0  # scaled scores above this would make exp() huge: subtract the largest first
MAX_ABS = 1e6  # larger typed numbers are refused (they only overflow)


@dataclass
class HandSteps:
    """Every number of one query's attention, in the order a learner computes them."""

    d_k: int  # length of the query and key vectors
    temperature: float  # multiplies 1/sqrt(d_k) (the explorer's d_k slider)
    scale: float  # the factor on the scores: temperature / sqrt(d_k)
    scores: np.ndarray  # (M,) q · k_j
    scaled: np.ndarray  # (M,) scores * scale
    shift: float  # subtracted before exp (0 unless the scaled scores are large); weights do not change
    exps: np.ndarray  # (M,) exp(scaled - shift)
    total: float  # sum of exps
    weights: np.ndarray  # (M,) softmax, from core's scaled_dot_product_attention
    output: np.ndarray  # (d_v,) the weighted average of the values, from core


def parse_table(rows: list[list[str]], what: str) -> np.ndarray:
    """Cell texts -> a float (rows, cols) array; a blank or non-number cell is one UserError line."""
    if not rows or not rows[0]:
        raise UserError(f"{what}: the table is empty; add a row")
    out = np.empty((len(rows), len(rows[0])), dtype=np.float64)
    for i, row in enumerate(rows):
        for j, text in enumerate(row):
            t = (text or "").strip().replace("−", "-")
            try:
                v = float(t)
            except ValueError:
                shown = t if t else "an empty cell"
                raise UserError(f"{what}, row {i + 1}, column {j + 1}: {shown!r} is not a number") from None
            if not math.isfinite(v) or abs(v) > MAX_ABS:
                raise UserError(f"{what}, row {i + 1}, column {j + 1}: use a number between -1e6 and 1e6")
            out[i, j] = v
    return out


def attend_by_hand(query, keys, values, temperature: float = 1.0) -> HandSteps:
    """Attention of one query over M keys and values. query: (d_k,) or (1, d_k); keys (M, d_k); values (M, d_v)."""
    q = torch.as_tensor(np.asarray(query, dtype=np.float64).reshape(1, -1))  # (1, d_k)
    k = torch.as_tensor(np.asarray(keys, dtype=np.float64))  # (M, d_k)
    v = torch.as_tensor(np.asarray(values, dtype=np.float64))  # (M, d_v)
    if k.ndim != 2 or k.shape[0] == 0:
        raise UserError("give at least one key")
    if k.shape[1] != q.shape[1]:
        raise UserError(f"the query has {q.shape[1]} numbers but each key has {k.shape[1]}; they must match")
    if v.ndim != 2 or v.shape[0] != k.shape[0]:
        raise UserError(f"there are {k.shape[0]} keys but {v.shape[0]} values; each key needs one value")
    if not (math.isfinite(temperature) and temperature > 0):
        raise UserError("the temperature must be a positive number")
    d_k = q.shape[1]
    out, probs = scaled_dot_product_attention(q, k, v, dk_scale=temperature)  # (1, d_v), (1, M)
    scale = attention_scale(d_k, temperature)
    scores = (k @ q[0]).numpy()  # (M,)
    scaled = scores * scale
    top = float(scaled.max())
    shift = top if top > EXP_SHIFT_ABOVE else 0.0
    exps = np.exp(scaled - shift)
    return HandSteps(d_k=d_k, temperature=float(temperature), scale=scale, scores=scores, scaled=scaled,
                     shift=shift, exps=exps, total=float(exps.sum()), weights=probs[0].numpy(),
                     output=out[0].numpy())


def core_source() -> str:
    """The lines of our core that compute this page: attention_scale and scaled_dot_product_attention."""
    return inspect.getsource(attention_scale) + "\n\n" + inspect.getsource(scaled_dot_product_attention)
