"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Each layer's heads are fused into one (N, N) map (mean, max or min over heads), the residual
connection is modelled as 0.5·A + 0.5·I with rows renormalised to sum to 1, and the layers are
multiplied from the first up: R = Â_L ··· Â_1. Row i of R says how much of token i's representation
at the top traces back to each input token.

`discard_ratio` follows jacobgil/vit-explain: in every layer the lowest fraction of the fused weights
is set to 0 before the residual is added. As there, the [CLS]→[CLS] weight is never dropped; here no
token's weight on itself is (the diagonal), since dropping it would only be added back by the residual.
"""
from __future__ import annotations

import numpy as np

from attn_explorer.errors import UserError

FUSIONS = ("mean", "max", "min")


def fuse_heads(layer_att: np.ndarray, fusion: str = "mean") -> np.ndarray:
    """(H, N, N) -> (N, N): the heads' mean, max or min."""
    if fusion not in FUSIONS:
        raise UserError(f"head fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}")
    a = np.asarray(layer_att, dtype=np.float32)  # float32 throughout: half the time of float64, ample for weights
    return {"mean": a.mean, "max": a.max, "min": a.min}[fusion](axis=0)


def discard_lowest(fused: np.ndarray, ratio: float) -> np.ndarray:
    """A copy of `fused` (N, N) with the lowest `ratio` of its N² weights set to 0; the diagonal is kept."""
    n = fused.shape[-1]
    out = np.array(fused, dtype=np.float32)
    count = int(n * n * ratio)
    if count <= 0:
        return out
    flat = out.reshape(-1).copy()
    flat[:: n + 1] = np.inf  # the diagonal is never among the lowest
    count = min(count, n * n - n)
    drop = np.argpartition(flat, count - 1)[:count]
    out.reshape(-1)[drop] = 0.0
    return out


def check_ratio(discard_ratio) -> float:
    try:
        r = float(discard_ratio)
    except (TypeError, ValueError):
        raise UserError(f"discard ratio must be a number from 0 to 1, got {discard_ratio!r}") from None
    if not 0.0 <= r < 1.0:
        raise UserError(f"discard ratio must be at least 0 and below 1, got {discard_ratio!r}")
    return r


def rollout_layers(att: np.ndarray, fusion: str = "mean", discard_ratio: float = 0.0) -> np.ndarray:
    """(L, H, N, N) -> (L, N, N): the rollout through layers 0..l, for every l (the last is the whole model)."""
    a = np.asarray(att)
    if a.ndim != 4 or a.shape[-1] != a.shape[-2]:
        raise UserError(f"rollout needs attention shaped (L, H, N, N), got {a.shape}")
    ratio = check_ratio(discard_ratio)
    L, _, N, _ = a.shape
    eye = np.eye(N, dtype=np.float32)
    out = np.empty((L, N, N), dtype=np.float32)
    result = eye
    for l in range(L):
        fused = discard_lowest(fuse_heads(a[l], fusion), ratio)
        step = 0.5 * fused + 0.5 * eye
        s = step.sum(axis=-1, keepdims=True)
        step = np.divide(step, s, out=np.zeros_like(step), where=s > 0)
        result = step @ result  # the newer layer on the left: its rows are the top tokens
        out[l] = result
    return out


def attention_rollout(att: np.ndarray, fusion: str = "mean", discard_ratio: float = 0.0,
                      upto: int | None = None) -> np.ndarray:
    """(L, H, N, N) -> (N, N) float32: the rollout through layers 0..upto (all of them when None)."""
    a = np.asarray(att)
    if a.ndim != 4:
        raise UserError(f"rollout needs attention shaped (L, H, N, N), got {a.shape}")
    L = a.shape[0]
    last = L - 1 if upto is None else int(upto)
    if not 0 <= last < L:
        raise UserError(f"layer {last} does not exist; the attention has layers 0..{L - 1}")
    return rollout_layers(a[: last + 1], fusion, discard_ratio)[-1]
