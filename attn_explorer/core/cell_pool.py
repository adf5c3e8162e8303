"""Pooling a signed map band by band (the recurrent heads' pooled views: core.mamba2.KeptMamba, core.deltanet).

A CellPool holds one (r, c) grid of cells over A[rows, cols] (edges as maths.pool_edges gives them, local to rows and
cols) and takes the map a band of rows at a time, in any order and with any band edges: a band may straddle row cells
or lie inside one (a long map pooled to few cells), and n need not divide into the cells. Each cell keeps its sum
(float64, for the mean) or its largest and smallest entry; the signed "max" is whichever has the larger magnitude.
A band need not hold every column: columns past its width are exactly 0 (the causal triangle), so a band of early
rows only computes the cells it can see (`visible`); `add_tile` takes a band a run of whole column cells at a time and
`hidden` says the band is 0 past its reach. All work is vectorised over the band; memory O(band × width)."""
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
        self._rows_seen = (None, None)  # the last band's row cells (a band comes in several tiles)
        if reduce == "mean":
            self.total = torch.zeros(r, c, dtype=torch.float64, device=device)
        else:
            # each cell's signed entry of largest magnitude so far (a tie: the positive one); 0 before any band, which
            # is what the columns a band cannot reach hold
            self.best = torch.zeros(r, c, dtype=torch.float64, device=device)

    def visible(self, stop: int) -> int:
        """The columns (from cols.start, a whole number of cells) holding every column < token `stop`: a band
        ending at row stop - 1 is 0 beyond them."""
        k = stop - self.cols.start
        if k <= 0:
            return 0
        j = bisect.bisect_left(self.ce, k)
        return self.ce[min(j, len(self.ce) - 1)]

    def _pool_cols(self, band: torch.Tensor, j0: int, j1: int):
        """band (rows, ce[j1] - ce[j0]): column cells j0..j1-1 -> per cell: sums (float64), or (max, min)."""
        w = self.widths[j0:j1]
        wmax, cells = int(w.max()), j1 - j0
        if int(w.min()) == wmax:  # equal cells: a view
            v = band.reshape(band.shape[0], cells, wmax)
            if self.reduce == "mean":
                return v.sum(-1, dtype=torch.float64)
            return v.amax(-1), v.amin(-1)
        start = torch.as_tensor(self.ce[j0:j1], device=band.device) - self.ce[j0]
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
        self.add_tile(a, b, band, 0)
        self.hidden(a, b, band.shape[1])

    def _row_cells(self, a: int, b: int, device):
        """(first row cell i0, past the last i1, each row's cell from i0, the rows each cell gets) of rows a..b-1."""
        if self._rows_seen[0] == (a, b, device):
            return self._rows_seen[1]
        r0, r1 = a - self.rows.start, b - self.rows.start
        i0 = bisect.bisect_right(self.re, r0) - 1
        i1 = bisect.bisect_left(self.re, r1)
        w = torch.as_tensor([min(max(e, r0), r1) - r0 for e in self.re[i0:i1 + 1]], device=device).diff()
        cell = torch.repeat_interleave(torch.arange(i1 - i0, device=device), w)
        self._rows_seen = ((a, b, device), (i0, i1, cell, w))
        return self._rows_seen[1]

    def add_tile(self, a: int, b: int, band: torch.Tensor, col0: int) -> None:
        """Rows a..b-1 of A[:, cols.start + col0 : … + band.shape[1]]: whole column cells (col0 and its end cell
        edges); nothing is said of the other columns."""
        if b <= a or band.shape[1] == 0:
            return
        j0 = bisect.bisect_left(self.ce, col0)
        j1 = bisect.bisect_left(self.ce, col0 + band.shape[1])
        i0, i1, cell, w = self._row_cells(a, b, band.device)
        if self.reduce == "mean":
            self.total[i0:i1, j0:j1].index_add_(0, cell, self._pool_cols(band, j0, j1))
            return
        hi, lo = self._pool_cols(band, j0, j1)
        if int(w.min()) == int(w.max()):  # whole, equal row cells (an aligned band): a view
            hi = hi.reshape(i1 - i0, -1, j1 - j0).amax(1)
            lo = lo.reshape(i1 - i0, -1, j1 - j0).amin(1)
        else:
            index = cell[:, None].expand(-1, j1 - j0)
            hi = hi.new_full((i1 - i0, j1 - j0), -torch.inf).scatter_reduce_(0, index, hi, "amax")
            lo = lo.new_full((i1 - i0, j1 - j0), torch.inf).scatter_reduce_(0, index, lo, "amin")
        self._merge(slice(i0, i1), slice(j0, j1), torch.where(hi.abs() >= lo.abs(), hi, lo).double())

    def _merge(self, r: slice, c: slice, new: torch.Tensor) -> None:
        """best[r, c] = whichever of it and `new` has the larger magnitude (a tie: the positive one)."""
        old = self.best[r, c]
        size, was = new.abs(), old.abs()
        self.best[r, c] = torch.where((size > was) | ((size == was) & (new > old)), new, old)

    def hidden(self, a: int, b: int, width: int) -> None:
        """Rows a..b-1 are 0 in every column from `width` on (a cell edge): the triangle a band cannot see. Nothing
        to do: a cell's mean sums what it saw, its signed largest entry starts at 0."""

    def result(self) -> torch.Tensor:
        """(r, c) float32: each cell's mean, or its signed entry of largest magnitude."""
        if self.reduce == "mean":
            re = torch.as_tensor(self.re, dtype=torch.float64, device=self.total.device).diff()
            return (self.total / (re[:, None] * self.widths[None, :].double())).float()
        return self.best.float()
