"""The rollout page: how much each input token feeds each token at the top, through the residual stream.

Attention rollout (Abnar & Zuidema 2020) multiplies the layers' head-fused attention, each mixed half
and half with the identity (the residual), from layer 0 up to the selected layer or the last. Text:
the (N, N) rollout as a token heatmap. Images: the query's row over the picture (the [CLS] row
unless a patch was clicked on the Patch overlay page), drawn as the overlay page draws heat.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QHBoxLayout, QLabel

from attn_explorer.gui.analysis.common import AnalysisPage, HeatPanel, untrained_tag
from attn_explorer.gui.widgets.heatmap import colormap, set_bar_label
from attn_explorer.gui.widgets.overlay import blend, heat_label, heat_levels, patch_heat
from attn_explorer.maths import clipped_label, clipped_values, kept_tokens, without_specials
from attn_explorer.session.analysis import FUSIONS, rollout_job
from attn_explorer.session.state import SessionState


class RolloutPage(AnalysisPage):
    def __init__(self, state: SessionState, parent=None):
        super().__init__(state, parent)
        self.fusion = QComboBox()
        self.fusion.addItems(FUSIONS)
        self.fusion.setToolTip("How the heads of a layer become one map: their mean, max or min")
        self.discard = QDoubleSpinBox()
        self.discard.setRange(0.0, 0.95)
        self.discard.setSingleStep(0.05)
        self.discard.setDecimals(2)
        self.discard.setToolTip("Drop this fraction of the lowest weights in every layer (never a token's own)")
        self.upto = QCheckBox("only up to the selected layer")
        bar = QHBoxLayout()
        for w in (QLabel("heads fused by"), self.fusion, QLabel("discard lowest"), self.discard, self.upto):
            bar.addWidget(w)
        bar.addStretch(1)
        self.panel = HeatPanel(self.canvas, 0, 0, state.colormap, "rollout")
        self.panel.plot.setLabel("left", "token at the top (row)")
        self.panel.plot.setLabel("bottom", "input token (column)")
        self.picture = self.canvas.addPlot(row=0, col=1)
        self.picture.invertY(True)
        self.picture.setAspectLocked(True)
        for side in ("left", "bottom"):
            self.picture.hideAxis(side)
        self.picture.setMenuEnabled(False)
        self.picture.hideButtons()
        self.picture_img = pg.ImageItem(axisOrder="row-major")
        self.picture.addItem(self.picture_img)
        self.pic_bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap(state.colormap), interactive=False, width=12)
        self.pic_bar.axis.enableAutoSIPrefix(False)
        self.pic_bar.axis.setWidth(None)  # wide enough for "0.007" and the title beside it
        set_bar_label(self.pic_bar, "rollout")
        self.canvas.addItem(self.pic_bar, row=0, col=2)
        self.finish_layout(bar)
        self.layers: np.ndarray | None = None  # (L, N, N) rollout through each layer
        self._for: tuple | None = None  # (result, fusion, discard) the layers describe
        self.shown: np.ndarray | None = None  # the (N, N) rollout of the layer on screen (every token)
        self.tokens: list[str] = []  # the tokens the text map labels (special ones gone when hidden)
        for sig in (self.fusion.currentIndexChanged, self.discard.valueChanged, self.upto.toggled):
            sig.connect(lambda *_: self.refresh())
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.attention_ready.connect(self.refresh)
        state.selection_changed.connect(lambda *_: self.refresh())
        state.query_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(self.refresh)

    def settings(self) -> tuple[str, float]:
        return self.fusion.currentText(), round(float(self.discard.value()), 4)

    def refresh(self, *_):
        self.readout.setText("")
        r = self.result_to_draw()
        if r is None:
            return
        key = (r,) + self.settings()
        if self._for is not None and self._for[0] is r and self._for[1:] == key[1:] and self.layers is not None:
            self._draw()
            return
        self.layers, self._for = None, None
        self.caption.setText("")
        self.stack.show_message("Rolling attention out through the layers…")
        fusion, ratio = self.settings()
        self.state.submit(rollout_job, r.attentions, fusion, ratio, key="analysis-rollout",
                          on_result=lambda out: self._arrived(key, out), on_error=self._failed, uses_model=False)

    def _arrived(self, key, layers) -> None:
        if key[0] is not self.state.result or key[1:] != self.settings():
            return
        self.layers, self._for = layers, key
        self._draw()

    def _draw(self) -> None:
        st, r = self.state, self.state.result
        self.stack.show_canvas()
        L = self.layers.shape[0]
        last = min(st.layer, L - 1) if self.upto.isChecked() else L - 1
        self.shown = self.layers[last]
        fusion, ratio = self.settings()
        through = f"layers 0–{last}" if last < L - 1 or self.upto.isChecked() else f"all {L} layers"
        how = f"heads fused by {fusion}" + (f", lowest {ratio:.0%} dropped per layer" if ratio else "")
        image = r.grid is not None and r.image is not None
        self.picture.setVisible(image)
        self.pic_bar.setVisible(image)
        self.panel.plot.setVisible(not image)
        log, hide = st.log_scale, st.hide_special
        if image:
            q = min(st.query, r.num_tokens - 1)
            heat = patch_heat(self.shown[q], r.grid, r.patch_offset, r.special if hide else None)
            ih, iw = r.image.shape[:2]
            self.picture_img.setImage(blend(r.image, heat, st.alpha, st.colormap, log=log), levels=(0, 255),
                                      autoLevels=False)
            self.picture_img.setRect(QRectF(0, 0, iw, ih))
            self.picture.setRange(xRange=(0, iw), yRange=(0, ih), padding=0.02)
            self.pic_bar.setColorMap(colormap(st.colormap))
            self.pic_bar.setLevels(values=heat_levels(heat, log)[1])
            set_bar_label(self.pic_bar, heat_label("rollout", log))
            who = "[CLS]" if q < r.patch_offset else f"patch {r.tokens[q]}"
            self.picture.setTitle(f"rollout of {who} over the patches")
            scale = "log₁₀, 4 powers of ten below" if log else "from 0 to"
            what = (f"Where <b>{who}</b> at the top of {through} draws from, patch by patch ({how}); colour {scale} "
                    "the map's 98th percentile" + (", rows renormalised over the patches" if hide else "")
                    + ". Pick another query by clicking a patch on the Overlay page.")
        else:
            kept = kept_tokens(r.special, r.num_tokens, hide)
            shown = without_specials(self.shown, r.special) if hide else self.shown
            tokens = [r.tokens[i] for i in kept]
            values, levels, _top = clipped_values(shown, log)
            self.panel.show(values, tokens, tokens, levels, st.colormap, title=f"rollout through {through}",
                            label=clipped_label("rollout", log))
            self.panel.matrix = np.asarray(shown)  # the read-out gives rollout values, not their logs
            hidden = (f" Special tokens hidden: {len(tokens)} of {r.num_tokens} tokens, rows renormalised."
                      if len(tokens) < r.num_tokens else "")
            what = (f"Row i: how much of token i's representation after {through} traces back to each input "
                    f"token, with the residual counted as half of every layer ({how}). Rows sum to 1. Colour "
                    + ("log₁₀, 4 powers of ten below" if log else "from 0 to")
                    + " the map's 99th percentile (a token's own weight is large and saturates)." + hidden)
            self.tokens = tokens
        self.caption.setText("<b>Attention rollout</b> — " + what + untrained_tag(st.info))

    def _hovered(self, pos) -> None:
        r = self.state.result
        hit = self.panel.cell_at(pos) if self.panel.plot.isVisible() else None
        if hit is None or r is None or self.panel.matrix is None:
            return
        i, j = hit
        self.readout.setText(f'"{self.tokens[i]}" at the top ← input "{self.tokens[j]}": {self.panel.matrix[i, j]:.3f}')
