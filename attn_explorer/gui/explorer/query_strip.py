"""The selected query's row over the whole text: one band under the one-head map, pooled to its width.

However long the input, this band spans every key: cell j is the largest weight of the keys it covers, so a
sharp look far back (retrieval, a sink) shows as a bright line. A box marks the keys the map shows now, a
tick the query itself, and the read-out names the keys the query reads most, with their exact weights.
Clicking the band moves the map to those keys. What it draws comes from the head view: a short input's row
from its dense map, a long input's from the strip lane (session.long_view.strip_job).
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from attn_explorer.gui.explorer.mixer_marks import diverging_colormap
from attn_explorer.gui.widgets.heatmap import colormap
from attn_explorer.session.mixers import signed_scaled, value_text
from attn_explorer.gui.widgets.heatmap import short as short_token
from attn_explorer.session.long_view import Strip, colour_scale

STRIP_HEIGHT = 34  # pixels of the band itself


class QueryStrip(QWidget):
    """One query's row over every key, with the keys it reads most named below it."""

    key_clicked = Signal(int)  # a key index: the user clicked the band there

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.canvas = pg.GraphicsLayoutWidget()
        self.canvas.setFixedHeight(STRIP_HEIGHT + 8)
        self.canvas.ci.layout.setContentsMargins(0, 0, 0, 0)
        self.plot = self.canvas.addPlot()
        for side in ("left", "bottom", "top", "right"):
            self.plot.hideAxis(side)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.window_box = pg.PlotCurveItem(pen=pg.mkPen("#ff3b30", width=2))
        self.plot.addItem(self.window_box)
        self.query_tick = pg.PlotCurveItem(pen=pg.mkPen("w", width=2))
        self.plot.addItem(self.query_tick)
        self.readout = QLabel("")
        self.readout.setWordWrap(True)
        self.readout.setTextFormat(Qt.RichText)
        self.strip: Strip | None = None
        self.shown_values: np.ndarray | None = None  # what the band draws (after the colour scale)
        self._n = 0
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.canvas)
        lay.addWidget(self.readout)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)

    def width_px(self) -> int:
        """Cells the band can show: one per pixel of its width."""
        return max(16, int(self.plot.vb.width()) or self.canvas.width())

    def clear(self, message: str = "") -> None:
        """Nothing to show (a new run, query or head is on its way): the old band goes."""
        self.strip = None
        self.shown_values = None
        self.image.clear()
        self.query_tick.setData([], [])
        self.readout.setText(message)

    def show_strip(self, strip: Strip, tokens: list[str], cmap: str, scale: str, log: bool, where: str = "",
                   signed: str = "") -> None:
        """Draw `strip` (query strip.query's row; tokens name the keys) in the colour scale given; `signed` (a
        recurrent layer's "implicit attention (...)") draws it on the diverging scale, values with their sign."""
        self.strip = strip
        n = self._n = strip.total
        scaled = (signed_scaled(strip.values[None, :], signed) if signed
                  else colour_scale(strip.values[None, :], scale, log))
        self.shown_values = scaled.values[0]
        self.image.setLookupTable((diverging_colormap() if signed else colormap(cmap)).getLookupTable(0.0, 1.0, 256))
        self.image.setImage(scaled.values, levels=scaled.levels, autoLevels=False)
        self.image.setRect(QRectF(0, 0, max(n, 1), 1))
        self.plot.setRange(xRange=(0, max(n, 1)), yRange=(0, 1), padding=0)
        q = strip.query + 0.5
        self.query_tick.setData([q, q], [0.0, 0.35])
        best = " · ".join(f'"{html.escape(short_token(tokens[j]))}" ({j:,}) <b>{value_text(w, bool(signed))}</b>'
                          for j, w in strip.top
                          if j < len(tokens))
        pooled = (f"each of its {len(strip.values):,} cells the largest weight of about "
                  f"{n / max(1, len(strip.values)):.0f} keys" if len(strip.values) < n else "one cell a key")
        q_tok = html.escape(short_token(tokens[strip.query])) if strip.query < len(tokens) else "?"
        self.readout.setText(f'Strip: query {strip.query:,} "{q_tok}" over all {n:,} keys ({pooled}; '
                             f"{html.escape(scaled.label, quote=False)}){where}. Reads most: {best}")

    def mark_window(self, lo: float, hi: float) -> None:
        """Box the keys [lo, hi) that the map shows now."""
        if self._n <= 0:
            self.window_box.setData([], [])
            return
        lo, hi = max(0.0, lo), min(float(self._n), hi)
        self.window_box.setData([lo, hi, hi, lo, lo], [0.02, 0.02, 0.98, 0.98, 0.02])

    def _clicked(self, ev) -> None:
        if self.strip is None or not self.plot.vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        x = self.plot.vb.mapSceneToView(ev.scenePos()).x()
        j = int(np.floor(x))
        if 0 <= j < self._n:
            self.key_clicked.emit(j)
