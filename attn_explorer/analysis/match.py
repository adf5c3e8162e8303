"""Two models' heads matched by what they do over the same corpus.

Each head is a vector of its atlas metrics. Every metric both atlases measured (NaN in neither) is
standardised over the heads of both models together (minus the pooled mean, over the pooled standard
deviation), so that no metric dominates by its units (distance in tokens, entropy in bits); the similarity
of two heads is the cosine of their standardised vectors. The Hungarian assignment
(scipy.optimize.linear_sum_assignment) then pairs heads one to one so that the summed similarity is largest;
with unequal head counts, every head of the smaller model gets a partner.
"""
from __future__ import annotations

import numpy as np

from attn_explorer.analysis.atlas import Atlas
from attn_explorer.errors import UserError


def shared_metrics(a: Atlas, b: Atlas) -> list[str]:
    """The metrics both atlases measured for every head (no NaN), in a's order."""
    return [n for n in a.metrics if n in b.metrics
            and not np.isnan(a.metrics[n]).any() and not np.isnan(b.metrics[n]).any()]


def similarity(a: Atlas, b: Atlas, names: list[str] | None = None) -> np.ndarray:
    """(La·Ha, Lb·Hb) cosine similarity of the heads' standardised metric vectors (rows layer-major)."""
    names = shared_metrics(a, b) if names is None else list(names)
    if len(names) < 2:
        raise UserError(f"matching heads needs at least two metrics that both atlases measured; shared: "
                        f"{', '.join(names) or 'none'}")
    _, va = a.vectors(names)
    _, vb = b.vectors(names)
    both = np.concatenate([va, vb])
    mu, sd = both.mean(axis=0), both.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    za, zb = (va - mu) / sd, (vb - mu) / sd
    na = np.linalg.norm(za, axis=1, keepdims=True)
    nb = np.linalg.norm(zb, axis=1, keepdims=True)
    za = np.divide(za, na, out=np.zeros_like(za), where=na > 0)
    zb = np.divide(zb, nb, out=np.zeros_like(zb), where=nb > 0)
    return za @ zb.T


def match_heads(a: Atlas, b: Atlas, names: list[str] | None = None) -> list[tuple[int, int, int, int, float]]:
    """The one-to-one pairing of a's heads with b's that maximises the summed similarity:
    [(layer_a, head_a, layer_b, head_b, similarity)], most similar first."""
    s = similarity(a, b, names)
    rows, cols = assignment(s)
    pairs = [(int(r // a.n_heads), int(r % a.n_heads), int(c // b.n_heads), int(c % b.n_heads), float(s[r, c]))
             for r, c in zip(rows, cols)]
    return sorted(pairs, key=lambda p: (-p[4], p[0], p[1]))


def assignment(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the one-to-one pairing with the largest summed s: scipy's linear_sum_assignment where
    scipy is installed, else the same Hungarian method here (O(n²·m), fine for a few thousand heads)."""
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError:
        return hungarian(s)
    return linear_sum_assignment(s, maximize=True)


def hungarian(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximum-weight assignment of an (n, m) matrix by shortest augmenting paths with potentials (Kuhn-Munkres
    as Jonker and Volgenant run it): every row of the shorter side is matched."""
    s = np.asarray(s, dtype=np.float64)
    flip = s.shape[0] > s.shape[1]
    cost = -(s.T if flip else s)  # minimise; rows n <= columns m
    n, m = cost.shape
    u, v = np.zeros(n + 1), np.zeros(m + 1)
    match = np.zeros(m + 1, dtype=np.int64)  # column j -> row (1-based), 0 = free
    for i in range(1, n + 1):
        match[0], j0 = i, 0
        dist = np.full(m + 1, np.inf)
        prev = np.zeros(m + 1, dtype=np.int64)
        used = np.zeros(m + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = match[j0]
            free = ~used[1:]
            red = cost[i0 - 1] - u[i0] - v[1:]
            better = free & (red < dist[1:])
            dist[1:][better] = red[better]
            prev[1:][better] = j0
            j1 = int(np.argmin(np.where(free, dist[1:], np.inf))) + 1
            delta = dist[j1]
            u[match[used]] += delta
            v[used] -= delta
            dist[1:][free] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while j0:
            j1 = prev[j0]
            match[j0] = match[j1]
            j0 = j1
    cols = np.nonzero(match[1:])[0]
    rows = match[1:][cols] - 1
    if flip:
        rows, cols = cols, rows
    order = np.argsort(rows)
    return rows[order], cols[order]
