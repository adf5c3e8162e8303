"""Pooling a signed map band by band (the recurrent heads' pooled views: core.mamba2.KeptMamba, core.deltanet).

A CellPool holds one (r, c) grid of cells over A[rows, cols] (edges as maths.pool_edges gives them, local to rows and
cols) and takes the map a band of rows at a time, in any order and with any band edges: a band may straddle row cells
or lie inside one (a long map pooled to few cells), and n need not divide into the cells. Each cell keeps its sum
(float64, for the mean) or its largest and smallest entry; the signed "max" is whichever has the larger magnitude.
A band need not hold every column: columns past its width are exactly 0 (the causal triangle), so a band of early
rows only computes the cells it can see (`visible`). All work is vectorised over the band; memory O(band × width)."""
from __future__ import annotations

import bisect

import torch


class CellPool:
    def __init__(self, row_edges, col_edges, reduce: str, rows: slice, cols: slice, device=None):
        if reduce not in ("max", "mean"):
            raise ValueError(f"reduce must be 'max' or 'mean', got {reduce!r}")
        self.reduce, self.rows, self.cols = reduce, rows, cols
        self.re = [int(e) for e in row_edges]
        self.ce = [int(e) for e in col_edges]
        self.device = device
        r, c = len(self.re) - 1, len(self.ce) - 1
        self.widths = torch.as_tensor(self.ce, device=device).diff()
        if reduce == "mean":
            self.total = torch.zeros(r, c, dtype=torch.float64, device=device)
        else:
            self.hi = torch.full((r, c), -torch.inf, dtype=torch.float64, device=device)
            self.lo = torch.full((r, c), torch.inf, dtype=torch.float64, device=device)

    def visible(self, stop: int) -> int:
        """The columns (from cols.start, a whole number of cells) holding every column < token `stop`: a band
        ending at row stop - 1 is 0 beyond them."""
        k = stop - self.cols.start
        if k <= 0:
            return 0
        j = bisect.bisect_left(self.ce, k)
        return self.ce[min(j, len(self.ce) - 1)]

    def _pool_cols(self, band: torch.Tensor, cells: int):
        """band (rows, ce[cells]) -> per column cell: sums (float64), or (max, min)."""
        w = self.widths[:cells]
        wmax = int(w.max())
        if int(w.min()) == wmax:  # equal cells: a view
            v = band.reshape(band.shape[0], cells, wmax)
            if self.reduce == "mean":
                return v.sum(-1, dtype=torch.float64)
            return v.amax(-1), v.amin(-1)
        start = torch.as_tensor(self.ce[:cells], device=band.device)
        off = torch.arange(wmax, device=band.device)
        idx = start[:, None] + off[None, :]
        inside = off[None, :] < w[:, None].to(band.device)
        idx = torch.minimum(idx, (start + w.to(band.device) - 1)[:, None])  # repeats: harmless for max and min
        g = band.index_select(1, idx.reshape(-1)).reshape(band.shape[0], cells, wmax)
        if self.reduce == "mean":
            return (g * inside).sum(-1, dtype=torch.float64)
        return g.amax(-1), g.amin(-1)

    def add(self, a: int, b: int, band: torch.Tensor) -> None:
        """Rows a..b-1 (absolute tokens) of A[:, cols.start : cols.start + band.shape[1]]; the band's width must be
        a cell edge (visible()); the columns after it are 0."""
        r0, r1 = a - self.rows.start, b - self.rows.start
        if r1 <= r0:
            return
        i0 = bisect.bisect_right(self.re, r0) - 1
        i1 = bisect.bisect_left(self.re, r1)
        local = torch.as_tensor([min(max(e, r0), r1) - r0 for e in self.re[i0:i1 + 1]], device=band.device)
        cell = torch.repeat_interleave(torch.arange(i1 - i0, device=band.device), local.diff())  # row -> its cell
        cells = bisect.bisect_left(self.ce, band.shape[1]) if band.shape[1] else 0
        if self.reduce == "mean":
            if cells:
                self.total[i0:i1, :cells].index_add_(0, cell, self._pool_cols(band, cells))
            return
        if cells:
            hi, lo = self._pool_cols(band, cells)
            w = local.diff()
            if int(w.min()) == int(w.max()):  # whole, equal row cells (an aligned band): a view
                hi = hi.reshape(i1 - i0, -1, cells).amax(1).double()
                lo = lo.reshape(i1 - i0, -1, cells).amin(1).double()
                torch.maximum(self.hi[i0:i1, :cells], hi, out=hi)
                torch.minimum(self.lo[i0:i1, :cells], lo, out=lo)
                self.hi[i0:i1, :cells], self.lo[i0:i1, :cells] = hi, lo
            else:
                self.hi[i0:i1, :cells].scatter_reduce_(0, cell[:, None].expand(-1, cells), hi.double(), "amax")
                self.lo[i0:i1, :cells].scatter_reduce_(0, cell[:, None].expand(-1, cells), lo.double(), "amin")
        self.hi[i0:i1, cells:].clamp_(min=0.0)  # the hidden columns' zeros
        self.lo[i0:i1, cells:].clamp_(max=0.0)

    def result(self) -> torch.Tensor:
        """(r, c) float32: each cell's mean, or its signed entry of largest magnitude."""
        if self.reduce == "mean":
            re = torch.as_tensor(self.re, dtype=torch.float64, device=self.total.device).diff()
            return (self.total / (re[:, None] * self.widths[None, :].double())).float()
        return torch.where(self.hi.abs() >= self.lo.abs(), self.hi, self.lo).float()
