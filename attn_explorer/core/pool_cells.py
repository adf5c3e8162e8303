"""Cells of a pooled view: their edges along an axis, runs of whole cells, and one axis reduced into them
(core.lazy's head_pooled; moved here from core.lazy to keep that module under the size limit)."""
from __future__ import annotations

import torch


def pool_edges(n: int, cells: int) -> torch.Tensor:
    """maths.pool_edges in torch: (cells + 1,) edges, edge c = floor(c·n / cells)."""
    cells = max(1, min(int(cells), int(n)))
    return torch.arange(cells + 1, dtype=torch.int64) * int(n) // cells


def _groups(edges: torch.Tensor, target: int) -> list[tuple[int, int]]:
    """Runs of whole cells [cell_a, cell_b) each covering about `target` items (at least one cell)."""
    e = edges.tolist()
    out, a = [], 0
    for b in range(1, len(e)):
        if e[b] - e[a] >= target or b == len(e) - 1:
            out.append((a, b))
            a = b
    return out


def _pool_axis(t: torch.Tensor, edges: torch.Tensor, reduce: str, dim: int) -> torch.Tensor:
    """Reduce `dim` of t into cells with local `edges` (starting at 0): max, or sum (for the mean)."""
    widths = edges[1:] - edges[:-1]
    w, cells = int(widths.max()), len(widths)
    shape = list(t.shape)
    if int(widths.min()) == w:  # equal cells: a view
        shape[dim:dim + 1] = [cells, w]
        v = t.reshape(shape)
        return v.amax(dim + 1) if reduce == "max" else v.sum(dim + 1, dtype=torch.float64)
    if reduce == "max":
        idx = (edges[:-1, None] + torch.arange(w)[None, :]).minimum(edges[1:, None] - 1)  # repeats are harmless
        g = t.index_select(dim, idx.reshape(-1).to(t.device))
        shape[dim:dim + 1] = [cells, w]
        return g.reshape(shape).amax(dim + 1)
    # sums over unequal cells: one product with the cells' 0/1 indicator (items × cells), BLAS-fast
    cell = torch.repeat_interleave(torch.arange(cells), widths)
    ind = (cell[:, None] == torch.arange(cells)[None, :]).to(t.dtype).to(t.device)
    return (t @ ind if dim == t.dim() - 1 or dim == -1 else (ind.T @ t)).double()
