"""One head's log-probability tiles, each one matrix product (core.lazy's tiles of a kept q and k, issue 24 E).

q is widened by −lse and k by a column of ones, so the product itself is the log-probability: no pass over the
tile to subtract lse. The widened k is made once a head (every tile reads it) and the widened q once a row block
(head_pooled walks a row block's column cells in turn), not once a tile: at 32,768 tokens those copies and the
cast of each tile were most of a pooled view's time. `Float32Tiles` computes in float32; `Bf16Tiles` in one
bfloat16 product where the CPU multiplies bfloat16 natively (core.bf16 states its error).
"""
from __future__ import annotations

import torch


class Float32Tiles:
    """scale·q·k − lse as one float32 product: q scaled and widened by −lse, k by ones."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, scale: float):
        self.q, self.k, self.lse, self.scale = q, k, lse, float(scale)  # q (N, d), k (M, d); lse (N,) float32
        self._kx: torch.Tensor | None = None
        self._qx: tuple | None = None  # ((start, stop), widened q rows)

    def _widen_k(self) -> torch.Tensor:
        k = self.k.float()
        return torch.cat([k, torch.ones(k.shape[0], 1, device=k.device)], dim=1)  # (M, d + 1)

    def _widen_q(self, rows: slice) -> torch.Tensor:
        return torch.cat([self.q[rows].float() * self.scale, -self.lse[rows, None]], dim=1)  # (r, d + 1)

    def _rows(self, rows: slice) -> torch.Tensor:
        key = (rows.start, rows.stop)
        if self._qx is None or self._qx[0] != key:
            self._qx = (key, self._widen_q(rows))
        return self._qx[1]

    def logits(self, rows: slice, cols: slice) -> torch.Tensor:
        """The tile's product (r, c), which `finish` makes log p: here log p itself."""
        if self._kx is None:
            self._kx = self._widen_k()
        return torch.matmul(self._rows(rows), self._kx[cols].T)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """logits (or a max over cells of them) -> log p, float32."""
        return x

    def log_probs(self, rows: slice, cols: slice) -> torch.Tensor:
        """scale · q·k − lse of rows × cols, (r, c) float32."""
        return self.finish(self.logits(rows, cols))


class Bf16Tiles(Float32Tiles):
    """One head's log-probability tiles as bfloat16 products: q widened by −lse/scale in a high and a low bfloat16
    column, k by two columns of ones, each widened once (k for every tile, q for the row block in use), so a tile
    is one product: `logits(rows, cols)` = q·k − lse/scale, bfloat16, rounded once; `finish` times it by scale in
    float32. A max over a tile's cells may be taken on `logits` and scaled after: the scaling's rounding is
    monotonic, so the cells are the same numbers (head_pooled, issue 24 E)."""

    def _widen_k(self) -> torch.Tensor:
        return torch.cat([self.k, self.k.new_ones(self.k.shape[0], 2)], dim=1)  # (M, d + 2)

    def _widen_q(self, rows: slice) -> torch.Tensor:
        shift = self.lse[rows] / self.scale
        hi = shift.bfloat16()
        lo = (shift - hi.float()).bfloat16()
        return torch.cat([self.q[rows], -hi[:, None], -lo[:, None]], dim=1)  # (r, d + 2)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().mul_(self.scale)
