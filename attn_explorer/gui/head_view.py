"""The head page: one head's N×N attention, large, with token labels on both axes.

Hovering a cell shows `query "it" → key "animal": 0.43`. The layer and head come from the session
(spin boxes in the window's toolbar, arrow keys); the colormap and linear/log scale too.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from attn_explorer.gui.heatmap import (LazyPage, PaintedGraphicsWidget, TokenAxis, add_heat_image, colormap,
                                       display_values, scale_label)
from attn_explorer.session.state import SessionState


class HeadView(LazyPage, QWidget):
    """One large heatmap of the selected head."""

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.title = QLabel("")
        self.readout = QLabel("Hover over the map: query → key: weight")
        self.readout.setStyleSheet("font-family: monospace;")
        self.canvas = PaintedGraphicsWidget()
        self.left_axis = TokenAxis("left")
        self.bottom_axis = TokenAxis("bottom", rotate=True)
        self.plot = self.canvas.addPlot(axisItems={"left": self.left_axis, "bottom": self.bottom_axis})
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setLabel("left", "query (row)")
        self.plot.setLabel("bottom", "key (column)")
        self.plot.getViewBox().setAspectLocked(False)
        self.image, self.colorbar = add_heat_image(self.plot, state.colormap)
        self.matrix: np.ndarray | None = None
        self.tokens: list[str] = []

        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.title)
        lay.addWidget(self.canvas, 1)
        lay.addWidget(self.readout)

        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.attention_ready.connect(self.refresh)
        state.selection_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(self._options)

    def refresh(self, *_):
        if not self.needs_draw():
            return
        r = self.state.result
        if r is None:
            return
        l, h = self.state.layer, self.state.head
        self.matrix = r.attentions[l, h]
        new_tokens = list(r.tokens)
        values, levels = display_values(self.matrix, self.state.log_scale)
        self.image.setImage(values, levels=levels, autoLevels=False)
        n = len(new_tokens)
        self.image.setRect(QRectF(0, 0, n, n))
        if new_tokens != self.tokens:
            self.tokens = new_tokens
            self.left_axis.set_labels(self.tokens, max_labels=48)
            self.bottom_axis.set_labels(self.tokens, max_labels=n)
            self.plot.setRange(xRange=(0, n), yRange=(0, n), padding=0)
        info = self.state.info
        tag = "" if info is None or info.trained else "  (untrained model: random weights)"
        causal = " — causal: no weight above the diagonal" if info is not None and info.causal else ""
        self.title.setText(f"<b>Layer {l}, head {h}</b> — {n}×{n}, dk scale {r.dk_scale:.2f}×{causal}{tag}")

    def _options(self):
        self.colorbar.setColorMap(colormap(self.state.colormap))
        self.colorbar.setLevels(values=display_values(np.zeros(1), self.state.log_scale)[1])
        self.colorbar.axis.setLabel(scale_label(self.state.log_scale))
        self.refresh()

    def describe(self, i: int, j: int) -> str:
        """`query "it" → key "animal": 0.43` for row i, column j."""
        return f'query "{self.tokens[i]}" → key "{self.tokens[j]}": {self.matrix[i, j]:.2f}'

    def _hovered(self, scene_pos):
        if self.matrix is None:
            return
        p = self.plot.vb.mapSceneToView(scene_pos)
        i, j = int(np.floor(p.y())), int(np.floor(p.x()))
        n = self.matrix.shape[0]
        if 0 <= i < n and 0 <= j < n:
            self.readout.setText(self.describe(i, j))
