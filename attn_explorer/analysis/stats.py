"""One number per head, for an L×H overview: what kind of head is this?

- entropy: mean row entropy in bits (log2(n) for a head that looks everywhere equally, 0 for one key).
- sink: mean share of each row's weight on special tokens and on the first token ("attention sinks").
- distance: mean attention distance, Σ_j α_ij·|i − j| in tokens for text; for images, over patch queries
  and patch keys (weights renormalised over the patches), the distance between patch centres in pixels.
- prev / next: the share of rows whose largest weight is on the previous / next token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.maths import entropy_bits

STATISTICS = {
    "entropy": "mean row entropy (bits)",
    "sink": "share on special and first tokens",
    "distance": "mean attention distance",
    "prev": "rows whose top key is the previous token",
    "next": "rows whose top key is the next token",
}


@dataclass
class HeadStats:
    entropy: np.ndarray  # float64 (L, H), bits
    sink: np.ndarray  # (L, H) in [0, 1]
    distance: np.ndarray  # (L, H), in `distance_unit`
    prev: np.ndarray  # (L, H) in [0, 1]
    next: np.ndarray  # (L, H) in [0, 1]
    distance_unit: str  # "tokens" or "px"

    def get(self, name: str) -> np.ndarray:
        if name not in STATISTICS:
            raise UserError(f"unknown statistic {name!r}: choose from {', '.join(STATISTICS)}")
        return getattr(self, name)


def sink_share(att, special) -> np.ndarray:
    """(..., N, N) -> (...): mean over rows of the weight on special tokens and the first token."""
    a = np.asarray(att)
    sinks = np.asarray(special, dtype=bool).copy()
    sinks[0] = True
    return a[..., sinks].sum(axis=-1, dtype=np.float64).mean(axis=-1)


def neighbour_share(att, offset: int) -> np.ndarray:
    """(..., N, N) -> (...): share of rows i (that have a token i + offset) whose argmax is i + offset."""
    a = np.asarray(att)
    n = a.shape[-1]
    top = a.argmax(axis=-1)  # (..., N)
    rows = np.arange(n)
    ok = (rows + offset >= 0) & (rows + offset < n)
    if not ok.any():
        return np.zeros(a.shape[:-2])
    return (top[..., ok] == (rows + offset)[ok]).mean(axis=-1)


def token_distance(att) -> np.ndarray:
    """(..., N, N) -> (...): mean over rows of Σ_j α_ij |i − j|, in tokens."""
    a = np.asarray(att)
    n = a.shape[-1]
    d = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]).astype(np.float32)
    return (a * d).sum(axis=-1, dtype=np.float64).mean(axis=-1)


def patch_distance(att, grid: tuple[int, int], offset: int, patch_size: float) -> np.ndarray:
    """(..., N, N) -> (...): mean over patch queries of the distance to patch keys, in pixels, with each
    row's weights renormalised over the patches (the extra tokens have no place in the picture)."""
    rows, cols = grid
    P = rows * cols
    a = np.asarray(att)[..., offset: offset + P, offset: offset + P].astype(np.float64)
    s = a.sum(axis=-1, keepdims=True)
    a = np.divide(a, s, out=np.zeros_like(a), where=s > 0)
    r, c = np.divmod(np.arange(P), cols)
    d = np.hypot(r[:, None] - r[None, :], c[:, None] - c[None, :]) * float(patch_size)
    return (a * d).sum(axis=-1).mean(axis=-1)


def head_stats(att, special, grid: tuple[int, int] | None = None, patch_offset: int = 0,
               patch_size: float | None = None) -> HeadStats:
    """Every statistic for every head of an (L, H, N, N) stack (RunResult.attentions).

    For images give grid (rows, cols), patch_offset and patch_size (pixels) to get distances in pixels."""
    a = np.asarray(att)
    if a.ndim != 4 or a.shape[-1] != a.shape[-2]:
        raise UserError(f"head statistics need attention shaped (L, H, N, N), got {a.shape}")
    if len(special) != a.shape[-1]:
        raise UserError(f"special has {len(special)} entries for {a.shape[-1]} tokens")
    if grid is not None and patch_size:
        dist, unit = patch_distance(a, grid, patch_offset, patch_size), "px"
    else:
        dist, unit = token_distance(a), "tokens"
    return HeadStats(entropy=entropy_bits(a).mean(axis=-1), sink=sink_share(a, special), distance=dist,
                     prev=neighbour_share(a, -1), next=neighbour_share(a, +1), distance_unit=unit)


@dataclass
class Finding:
    layer: int  # -1 when the line is about many heads
    head: int
    text: str


def findings(s: HeadStats, share: float = 0.5) -> list[Finding]:
    """The few lines worth reading first: how many heads are sinks, and the clearest positional heads."""
    L, H = s.sink.shape
    out = [Finding(-1, -1, f"{int((s.sink > share).sum())} of {L * H} heads put more than {share:.0%} of their "
                           "weight on special tokens or the first token")]
    for name, what in (("prev", "previous"), ("next", "next")):
        v = s.get(name)
        l, h = np.unravel_index(int(np.argmax(v)), v.shape)
        if v[l, h] > share:
            out.append(Finding(int(l), int(h), f"L{l} H{h} attends most to the {what} token in {v[l, h]:.0%} of rows"))
    l, h = np.unravel_index(int(np.argmin(s.entropy)), s.entropy.shape)
    out.append(Finding(int(l), int(h), f"L{l} H{h} is the most focused head ({s.entropy[l, h]:.2f} bits per row)"))
    l, h = np.unravel_index(int(np.argmax(s.distance)), s.distance.shape)
    out.append(Finding(int(l), int(h), f"L{l} H{h} looks farthest ({s.distance[l, h]:.1f} {s.distance_unit} on average)"))
    return out
