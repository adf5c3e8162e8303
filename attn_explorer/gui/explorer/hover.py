"""The head page's hover read-out: the line under the map and what it says about the cell under the pointer,
`query "it" → key "animal": 0.43`, or for a long map's pooled cell the range of queries and keys it covers."""
from __future__ import annotations

import numpy as np
from PySide6.QtWidgets import QSizePolicy, QWidget
from superqt import QElidingLabel

from attn_explorer.session.long_view import Window

HOVER_HINT = "Hover over the map: query → key: weight. Wheel zooms, drag pans."


class HoverLine(QElidingLabel):
    """The hover read-out: one line elided to the room there is, its whole text in the tooltip. It never asks
    for more width (at 1024 px a long input's line widened the window and cut off the colour bar)."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.setMinimumWidth(0)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        super().setText(text)
        self.setToolTip(text)


def cell_text(rows: list[str], cols: list[str], matrix: np.ndarray, i: int, j: int) -> str:
    """`query "it" → key "animal": 0.43` for row i, column j of a map drawn whole."""
    return f'query "{rows[i]}" → key "{cols[j]}": {matrix[i, j]:.2f}'


def window_cell_text(windows: tuple[Window | None, ...], rows: list[str], cols: list[str], i: int, j: int
                     ) -> str | None:
    """What the pointer is over in a long map, from the first window that holds cell (i, j): one weight at
    full resolution, else the pooled cell; None when no window holds it yet."""
    for win in windows:
        if win is None or not (win.ask.rows[0] <= i < win.ask.rows[1] and win.ask.cols[0] <= j < win.ask.cols[1]):
            continue
        a = int(np.searchsorted(win.row_edges, i, side="right") - 1)
        b = int(np.searchsorted(win.col_edges, j, side="right") - 1)
        v = float(win.values[a, b])
        r0, r1, c0, c1 = win.row_edges[a], win.row_edges[a + 1], win.col_edges[b], win.col_edges[b + 1]
        if r1 - r0 == 1 and c1 - c0 == 1:
            return f'query "{rows[i]}" ({i:,}) → key "{cols[j]}" ({j:,}): {v:.3f}'
        return (f"queries {r0:,}–{r1 - 1:,} → keys {c0:,}–{c1 - 1:,}: largest weight {v:.3f} "
                "(pooled: zoom in for each weight)")
    return None
