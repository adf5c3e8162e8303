"""The one-head view on a vision-language run (issue 26 B): the image tokens drawn as labelled bands ("image tile 2
(t1), 16 × 16", "image 16 × 16" for a one-view model) instead of hundreds of rows named only by number.

- `BandedAxis`, the head page's token axes: while the tokens are too many for a label each, each image block
  gets one label at its middle ("tile 2 16×16") and the text tokens keep their words (each where there is room),
  instead of every k-th token, which on such a run is nearly always an image token. Zoomed in until every
  token has a line, every token is named as before ("<image t1 r3c5>").
- `ImageBands`: dashed lines at each block's edges across the map (rows and columns) and the block's name in
  words at its corner on the diagonal.

The blocks come from session.vlm.image_blocks (the run's image-token positions), placed on the rows shown (with
the special tokens hidden the image tokens stay, the rows before them shift).
"""
from __future__ import annotations

import bisect

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QFontMetrics

from attn_explorer.gui.widgets.heatmap import TokenAxis
from attn_explorer.session.vlm import ImageBlock, image_blocks

BAND_PEN = pg.mkPen((255, 255, 255, 200), width=1, style=pg.QtCore.Qt.DashLine)


class BandedAxis(TokenAxis):
    """A TokenAxis that names image blocks once and keeps the text tokens' words when crowded (module doc)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.blocks: list[tuple[int, int, str]] = []  # (first, stop, short label) in axis units

    def set_blocks(self, blocks: list[tuple[int, int, str]]) -> None:
        self.blocks = blocks
        self.picture = None
        self.update()

    def drawn_labels(self) -> list[tuple[float, str]]:
        step = self.token_step()
        if not self.blocks or step <= 1:
            return super().drawn_labels()
        n, length = len(self._labels), self._along()
        lo, hi = sorted(self.range)
        room = self._room()
        if self.orientation in ("top", "bottom") and not self._rotate:
            room = max(room, QFontMetrics(self._font()).horizontalAdvance("tile 00 00×00") + 6)
        taken: list[float] = []  # pixels of the labels kept, sorted

        def fits(px: float) -> bool:
            at = bisect.bisect_left(taken, px)
            return all(abs(px - taken[j]) >= room for j in (at - 1, at) if 0 <= j < len(taken))

        out = []
        inside = np.zeros(n, bool)
        for first, stop, short in self.blocks:  # one label per block, at its visible middle
            inside[first:stop] = True
            a, b = max(first, lo), min(stop, hi)
            if b <= a:
                continue
            px = self._to_px((a + b) / 2, length)
            if -1 <= px <= length + 1 and fits(px):
                bisect.insort(taken, px)
                out.append((px, f"▮ {short}"))
        for i in range(max(0, int(np.floor(lo))), min(n - 1, int(np.ceil(hi))) + 1):  # the words, where they fit
            if inside[i]:
                continue
            px = self._to_px(i + 0.5, length)
            if -1 <= px <= length + 1 and fits(px):
                bisect.insort(taken, px)
                out.append((px, self._labels[i]))
        return sorted(out)


class ImageBands:
    """The bands over a head view's map (see the module doc). `ImageBands.on(view).show(view)` after the view
    laid its axes out: view.plot, view.left_axis / bottom_axis (BandedAxis), view.shown_rows, view.state."""

    def __init__(self, plot: pg.PlotItem, axes: tuple):
        self.plot, self.axes = plot, axes
        self.blocks: list[ImageBlock] = []
        self.spans: list[tuple[int, int]] = []  # each block's rows (= columns) in the map drawn
        self._items: list = []
        self._names: list[pg.TextItem] = []
        plot.vb.sigRangeChanged.connect(lambda *_: self._fit_names())

    @classmethod
    def on(cls, view) -> "ImageBands":
        if getattr(view, "bands", None) is None:
            view.bands = cls(view.plot, (view.left_axis, view.bottom_axis))
        return view.bands

    def show(self, view) -> None:
        """Bands for the view's result, or none (another kind of run, or the decoder / cross stacks)."""
        r = view.state.result
        self.blocks = image_blocks(r) if view.stack_shown == "encoder" else []
        rows = np.asarray(view.shown_rows)
        self.spans = [(int(np.searchsorted(rows, b.start)), int(np.searchsorted(rows, b.stop))) for b in self.blocks]
        for item in self._items + self._names:
            self.plot.removeItem(item)
        self._items, self._names = [], []
        for axis in self.axes:
            if isinstance(axis, BandedAxis):
                axis.set_blocks([(a, z, b.short) for b, (a, z) in zip(self.blocks, self.spans)])
        R, C = len(view.tokens), len(view.col_tokens)
        for b, (a, z) in zip(self.blocks, self.spans):
            for v in {a, z} - {0}:
                self._items.append(pg.PlotCurveItem([0, C], [v, v], pen=BAND_PEN))  # rows
                if v < C:
                    self._items.append(pg.PlotCurveItem([v, v], [0, R], pen=BAND_PEN))  # columns
            name = pg.TextItem(b.label, color="w", fill=pg.mkBrush(0, 0, 0, 150), anchor=(0, 0))
            name.setPos(a, a)
            self._names.append(name)
        for item in self._items + self._names:
            self.plot.addItem(item, ignoreBounds=True)
        self._fit_names()

    def _fit_names(self) -> None:
        """A block's name shows where the block is wider on screen than the name (else the axes name it)."""
        if not self._names:
            return
        (x0, x1), _ = self.plot.vb.viewRange()
        width = self.plot.vb.width()
        per = width / (x1 - x0) if x1 > x0 else 0.0
        for name, (a, z) in zip(self._names, self.spans):
            name.setVisible((z - a) * per >= name.boundingRect().width())

    def names(self) -> list[str]:
        """The names drawn on the map now (tests, the report)."""
        return [n.textItem.toPlainText() for n in self._names if n.isVisible()]
