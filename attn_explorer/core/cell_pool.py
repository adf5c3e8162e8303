"""Pooling a signed map band by band (the recurrent heads' pooled views: core.mamba2.KeptMamba, core.deltanet).

A CellPool holds one (r, c) grid of cells over A[rows, cols] (edges as maths.pool_edges gives them, local to rows and
cols) and takes the map a band of rows at a time, in any order and with any band edges: a band may straddle row cells
or lie inside one (a long map pooled to few cells), and n need not divide into the cells. Each cell keeps its sum
(float64, for the mean) or its largest and smallest entry; the signed "max" is whichever has the larger magnitude.
A band need not hold every column: columns past its width are exactly 0 (the causal triangle), so a band of early
rows only computes the cells it can see (`visible`). `add` pools a band's rows into their cells, then its columns; a
band made in tiles of columns can pool each tile's rows as it comes (`pool_rows`, into one array a band) and hand the
band's row cells over once (`add_rows`). All work is vectorised; memory O(band × width)."""
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

    def _pool_cols(self, t: torch.Tensor, op: str) -> torch.Tensor:
        """t (rows, w), w a cell edge: its columns reduced into their cells by op ("amax", "amin", "sum": float64)."""
        cells = bisect.bisect_left(self.ce, t.shape[1])
        w = self.widths[:cells]
        wmax = int(w.max())
        if op == "sum":
            t = t.double()
        if int(w.min()) == wmax:  # equal cells: a view
            return getattr(t.reshape(t.shape[0], cells, wmax), op)(-1)
        start = torch.as_tensor(self.ce[:cells], device=t.device)
        off = torch.arange(wmax, device=t.device)
        idx = torch.minimum(start[:, None] + off[None, :], (start + w.to(t.device) - 1)[:, None])  # repeats:
        g = t.index_select(1, idx.reshape(-1)).reshape(t.shape[0], cells, wmax)  # harmless for max and min
        if op == "sum":
            return (g * (off[None, :] < w[:, None].to(t.device))).sum(-1)
        return getattr(g, op)(-1)

    def row_cells(self, a: int, b: int, device=None):
        """(i0, i1, cell, n) for rows a..b-1 (absolute tokens): the row cells i0..i1-1 they touch, each row's cell
        from i0 and each cell's count of them (tensors on `device`). The last band's answer is kept (tiles)."""
        if self._rows_seen[0] == (a, b, device):
            return self._rows_seen[1]
        r0, r1 = a - self.rows.start, b - self.rows.start
        i0 = bisect.bisect_right(self.re, r0) - 1
        i1 = bisect.bisect_left(self.re, r1)
        n = torch.as_tensor([min(max(e, r0), r1) - r0 for e in self.re[i0:i1 + 1]], device=device).diff()
        cell = torch.repeat_interleave(torch.arange(i1 - i0, device=device), n)
        self._rows_seen = ((a, b, device), (i0, i1, cell, n))
        return self._rows_seen[1]

    def pool_rows(self, a: int, b: int, band: torch.Tensor, out=None):
        """band (rows a..b-1, any columns) -> per row cell it touches, each column's max and min (reduce "max")
        or sum (float64, "mean"): a tuple of (i1 - i0, columns) tensors, written into `out`'s when given."""
        i0, i1, cell, n = self.row_cells(a, b, band.device)
        ops = ("amax", "amin") if self.reduce == "max" else ("sum",)
        out = out or [None] * len(ops)
        if int(n.min()) == int(n.max()):  # whole, equal row cells (an aligned band): a view
            v = band.reshape(i1 - i0, -1, band.shape[1])
            if self.reduce == "mean":
                return (torch.sum(v, 1, dtype=torch.float64, out=out[0]),)
            return tuple(getattr(torch, op)(v, 1, out=o) for op, o in zip(ops, out))
        res = []
        for op, o in zip(ops, out):
            o = band.new_empty(i1 - i0, band.shape[1], dtype=torch.float64 if op == "sum" else band.dtype) \
                if o is None else o
            if op == "sum":
                res.append(o.zero_().index_add_(0, cell, band.double()))
            else:
                res.append(o.scatter_reduce_(0, cell[:, None].expand_as(band), band, op, include_self=False))
        return tuple(res)

    def add_rows(self, a: int, b: int, *pooled: torch.Tensor) -> None:
        """pool_rows' answer for rows a..b-1 over the columns 0..w (w a cell edge: visible()); the columns after
        them are 0."""
        if b <= a or pooled[0].shape[1] == 0:
            return
        i0, i1 = self.row_cells(a, b, pooled[0].device)[:2]
        if self.reduce == "mean":
            self.total[i0:i1, :bisect.bisect_left(self.ce, pooled[0].shape[1])] += self._pool_cols(pooled[0], "sum")
            return
        hi, lo = self._pool_cols(pooled[0], "amax"), self._pool_cols(pooled[1], "amin")
        new = torch.where(hi.abs() >= lo.abs(), hi, lo).double()
        old = self.best[i0:i1, :new.shape[1]]
        size, was = new.abs(), old.abs()  # keep whichever is larger in magnitude (a tie: the positive one)
        self.best[i0:i1, :new.shape[1]] = torch.where((size > was) | ((size == was) & (new > old)), new, old)

    def add(self, a: int, b: int, band: torch.Tensor) -> None:
        """Rows a..b-1 (absolute tokens) of A[:, cols.start : cols.start + band.shape[1]]; the band's width must be
        a cell edge (visible()); the columns after it are 0."""
        if b > a and band.shape[1]:
            self.add_rows(a, b, *self.pool_rows(a, b, band))

    def result(self) -> torch.Tensor:
        """(r, c) float32: each cell's mean, or its signed entry of largest magnitude."""
        if self.reduce == "mean":
            re = torch.as_tensor(self.re, dtype=torch.float64, device=self.total.device).diff()
            return (self.total / (re[:, None] * self.widths[None, :].double())).float()
        return self.best.float()
