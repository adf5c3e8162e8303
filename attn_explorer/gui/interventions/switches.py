"""The Switch-off page's two drawings of the heads: `HeadSwitches`, an L×H grid of cells a click switches off
(red) or on again (grey), and `EffectBars`, the clean run against the run with those heads off, as pairs of
horizontal bars (next tokens, classes, or the sentence embedding's similarity). Drawing only."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal

from attn_explorer.gui.widgets.heatmap import PaintedGraphicsWidget, TokenAxis, cell_centre, cell_under
from attn_explorer.gui.widgets.tokens import token_text

OFF_COLOURS = pg.ColorMap([0.0, 0.5, 1.0], [(236, 236, 236), (200, 40, 40), (120, 120, 120)])  # on; off: red; absent
ABSENT = 2.0  # a head its layer does not have (a hybrid's narrower layer, issue 25): dark grey, not clickable
BEFORE, AFTER = "#8c8c8c", "#dd8452"


def grid_plot(canvas, bottom=None) -> pg.PlotItem:
    """A fixed L×H plot (layer down) on `canvas`."""
    p = canvas.addPlot(row=0, col=0, axisItems={"left": TokenAxis("left"), "bottom": bottom or TokenAxis("bottom")})
    p.invertY(True)
    p.setMenuEnabled(False)
    p.hideButtons()
    p.setMouseEnabled(x=False, y=False)
    p.setLabel("left", "layer")
    return p


def label_cells(plot: pg.PlotItem, rows: int, cols: int, col_labels: list[str] | None = None) -> None:
    """Layer numbers down and head numbers (or tokens) across, as many as fit."""
    for side, labels in (("left", [str(i) for i in range(rows)]),
                         ("bottom", col_labels or [str(j) for j in range(cols)])):
        axis = plot.getAxis(side)
        if axis._labels != labels:
            axis.set_labels(labels)


class HeadSwitches(PaintedGraphicsWidget):
    """One cell per head: red while switched off, dark grey where the layer has no such head. A left click on a
    head emits `toggled(layer, head)`."""

    toggled = Signal(int, int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.plot = grid_plot(self)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.plot.setTitle("layer × head")
        self.shape: tuple[int, int] | None = None  # (L, H) drawn
        self.scene().sigMouseClicked.connect(self._clicked)
        self.setMinimumWidth(170)

    def draw(self, layers: int, heads: int, off, layer_heads: tuple[int, ...] = ()) -> None:
        """`layer_heads`: each layer's own head count where a hybrid's layers differ (ModelInfo.layer_heads)."""
        grid = np.zeros((layers, heads), dtype=np.float32)
        for l, h in off:
            grid[l, h] = 1.0
        for l, n in enumerate(layer_heads[:layers]):
            grid[l, n:] = ABSENT
        self.shape = (layers, heads)
        self.image.setImage(grid, levels=(0, ABSENT), lut=OFF_COLOURS.getLookupTable(0, 1, 3))
        self.image.setRect(0, 0, heads, layers)
        label_cells(self.plot, layers, heads)
        self.plot.setRange(xRange=(0, heads), yRange=(0, layers), padding=0)

    def centre(self, layer: int, head: int):
        """Scene position of a head's cell (tests click here)."""
        return cell_centre(self.plot, layer, head)

    def _clicked(self, ev) -> None:
        if self.shape is None or ev.button() != Qt.LeftButton:
            return
        hit = cell_under(self.plot, ev.scenePos(), self.shape)
        if hit is not None and self.image.image[hit] != ABSENT:
            self.toggled.emit(*hit)


class EffectBars(PaintedGraphicsWidget):
    """The clean run (grey) against heads off (orange): one pair of horizontal bars per token or class."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.axis = TokenAxis("left")  # horizontal bars: the labels read across, unrotated
        self.axis.fit_every_label = True  # a dozen bars at most: each is named, in a smaller font if need be
        self.plot = self.addPlot(row=0, col=0, axisItems={"left": self.axis})
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.invertY(True)
        self.plot.getAxis("bottom").enableAutoSIPrefix(False)
        self.before = pg.BarGraphItem(x0=[], y=[], height=0.38, width=[], brush=BEFORE)
        self.after = pg.BarGraphItem(x0=[], y=[], height=0.38, width=[], brush=AFTER)
        self.plot.addItem(self.before)
        self.plot.addItem(self.after)

    def draw(self, c, how: str) -> str:
        """Draw a Comparison (`how`: the switch-off's name); returns the line that says what changed."""
        off = f"{c.heads} head{'s' * (c.heads != 1)} off ({how})"
        if c.kind == "similarity":
            labels, before, after = ["similarity"], np.ones(1), np.asarray([c.similarity])
            text = f"{off}: {c.metric} with the clean run = <b>{c.similarity:.4f}</b> (1: unchanged)."
            ylabel = "cosine"
        else:
            labels, before, after = list(c.labels), np.asarray(c.before), np.asarray(c.after)
            b, a = int(np.argmax(before)), int(np.argmax(after))
            name = token_text if c.kind == "decoder" else str
            text = (f"{off}: top {'next token' if c.kind == 'decoder' else 'class'} "
                    f"<b>{name(labels[b])}</b> {before[b]:.3f} → <b>{name(labels[a])}</b> {after[a]:.3f} (clean grey, "
                    f"heads off orange).")
            ylabel = c.metric
        if not c.heads:
            text = "All heads on: the bars show the clean run. Click heads in the grid to switch them off."
        n = len(labels)
        y = np.arange(n) + 0.5
        self.before.setOpts(x0=np.zeros(n), y=y - 0.2, height=0.38, width=before)
        self.after.setOpts(x0=np.zeros(n), y=y + 0.2, height=0.38, width=after)
        self.axis.set_labels([token_text(t) for t in labels] if c.kind == "decoder" else labels)
        top = float(max(before.max(initial=0), after.max(initial=0), 1e-6))
        self.plot.setRange(xRange=(0, top * 1.05), yRange=(0, n), padding=0)
        # no title: its line is the room the bars' labels need at 1024×700; the colours are named below them
        self.plot.setLabel("bottom", f"{ylabel}: clean grey, heads off orange")
        return text
