"""The head page: one head's N×N attention, large, with token labels on both axes.

Hovering a cell shows `query "it" → key "animal": 0.43`; a new result clears that line, since it
described the old map. The layer and head come from the session (spin boxes in the window's toolbar,
arrow keys); the colormap, linear/log scale and "hide special tokens" too. Long inputs stay legible:
the axes label as many tokens as fit, and the mouse wheel zooms in (drag pans) until every token has
its label.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QRectF, Signal
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from attn_explorer.gui.widgets.heatmap import (CanvasStack, LazyPage, PaintedGraphicsWidget, TokenAxis, add_heat_image,
                                       cell_under, display_values, follow_loading, style_colorbar)
from attn_explorer.maths import kept_tokens, without_specials
from attn_explorer.session.state import SessionState

HOVER_HINT = "Hover over the map: query → key: weight. Wheel zooms, drag pans."


def head_matrix(r, layer: int, head: int, hide_special: bool) -> tuple[np.ndarray, list[str]]:
    """The (n, n) map to draw and its token labels; with hide_special, specials dropped and rows renormalised."""
    m = r.attentions[layer, head]
    if not hide_special:
        return m, list(r.tokens)
    return without_specials(m, r.special), [r.tokens[i] for i in kept_tokens(r.special, len(r.tokens))]


def shown_count(r, n: int) -> str:
    """What an n×n map of result r shows, in words that agree with the token count elsewhere: "16×16 (all 16
    tokens)", or "256×256: 256 of 257 tokens, 1 special hidden, rows renormalised"."""
    total = r.num_tokens
    if n == total:
        return f"{n}×{n} (all {total} tokens)"
    return f"{n}×{n}: {n} of {total} tokens, {total - n} special hidden, rows renormalised"


class HeadView(LazyPage, QWidget):
    """One large heatmap of the selected head. Double-clicking a row asks to look inside the head for that
    query token (`inside_requested(token index)`; the window opens the "Inside a head" lesson)."""

    inside_requested = Signal(int)

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.title = QLabel("")
        self.readout = QLabel(HOVER_HINT)
        self.readout.setStyleSheet("font-family: monospace;")
        self.canvas = PaintedGraphicsWidget()
        self.stack = CanvasStack(self.canvas)
        self.placeholder = self.stack.placeholder
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
        lay.addWidget(self.stack, 1)
        lay.addWidget(self.readout)

        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        state.attention_ready.connect(self.refresh)
        state.selection_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(self._options)
        state.model_loading.connect(lambda *_: self.readout.setText(HOVER_HINT))
        follow_loading(state, self.stack.show_message)

    def refresh(self, *_):
        self.readout.setText(HOVER_HINT)  # it described the map being replaced
        r = self.result_to_draw()
        if r is None:
            return
        self.stack.show_canvas()
        l, h = self.state.layer, self.state.head
        self.matrix, new_tokens = head_matrix(r, l, h, self.state.hide_special)
        values, levels = display_values(self.matrix, self.state.log_scale)
        self.image.setImage(values, levels=levels, autoLevels=False)
        n = len(new_tokens)
        self.image.setRect(QRectF(0, 0, n, n))
        if new_tokens != self.tokens:
            self.tokens = new_tokens
            self.left_axis.set_labels(self.tokens)
            self.bottom_axis.set_labels(self.tokens)
            vb = self.plot.getViewBox()
            vb.setLimits(xMin=0, xMax=n, yMin=0, yMax=n, minXRange=min(n, 4), minYRange=min(n, 4))
            self.plot.setRange(xRange=(0, n), yRange=(0, n), padding=0)
        info = self.state.info
        tag = "" if info is None or info.trained else "  (untrained model: random weights)"
        causal = " — causal: no weight above the diagonal" if info is not None and info.causal else ""
        self.title.setText(f"<b>Layer {l}, head {h}</b> — {shown_count(r, n)}, dk scale {r.dk_scale:.2f}×{causal}{tag}")

    def _options(self):
        style_colorbar(self.colorbar, self.state.colormap, self.state.log_scale)
        self.refresh()

    def describe(self, i: int, j: int) -> str:
        """`query "it" → key "animal": 0.43` for row i, column j."""
        return f'query "{self.tokens[i]}" → key "{self.tokens[j]}": {self.matrix[i, j]:.2f}'

    def _clicked(self, ev) -> None:
        r = self.state.result
        if not ev.double() or self.matrix is None or r is None:
            return
        i = int(np.floor(self.plot.vb.mapSceneToView(ev.scenePos()).y()))
        shown = kept_tokens(r.special, r.num_tokens, len(self.tokens) < r.num_tokens)  # row i: the i-th shown
        if 0 <= i < len(shown):
            self.state.set_query(int(shown[i]))
            self.inside_requested.emit(int(shown[i]))

    def _hovered(self, scene_pos):
        if self.matrix is None:
            return
        n = self.matrix.shape[0]
        hit = cell_under(self.plot, scene_pos, (n, n))
        if hit is not None:
            self.readout.setText(self.describe(*hit))
