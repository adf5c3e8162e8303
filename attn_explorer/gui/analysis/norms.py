"""The value-norms page: raw attention beside ‖α_ij f_h(x_j)‖ (Kobayashi et al. 2020), for the selected head.

A head adds Σ_j α_ij f_h(x_j) to token i, where f_h(x_j) = W_O^h (W_V^h x_j + b_V^h). Where a large
weight meets a small vector, the weight says little: raw maps light up [CLS], [SEP] and full stops
whose transformed values are short. The bars below give ‖f_h(x_j)‖ per token. The norms come from one
extra forward pass of the current model in a worker (every layer at once), so changing the head or the
layer only redraws.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from attn_explorer.gui.analysis.common import AnalysisPage, HeatPanel, peak, untrained_tag
from attn_explorer.gui.widgets.heatmap import TokenAxis
from attn_explorer.session.analysis import AnalysisSlot, calc, norms_job
from attn_explorer.session.state import SessionState


class NormsPage(AnalysisPage):
    def __init__(self, state: SessionState, parent=None):
        super().__init__(state, parent)
        self.slot = AnalysisSlot(self._failed)
        self.raw = HeatPanel(self.canvas, 0, 0, state.colormap, "weight α")
        self.norm = HeatPanel(self.canvas, 0, 1, state.colormap, "‖α f(x)‖")
        for p in (self.raw, self.norm):
            p.plot.setLabel("left", "query")
        self.bar_axis = TokenAxis("bottom", rotate=True)
        self.bars_plot = self.canvas.addPlot(row=1, col=0, colspan=2, axisItems={"bottom": self.bar_axis})
        self.bars_plot.setMenuEnabled(False)
        self.bars_plot.hideButtons()
        self.bars_plot.setMouseEnabled(x=False, y=False)
        self.bars_plot.setLabel("left", "‖f(x_j)‖")
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush="#4c72b0")
        self.bars_plot.addItem(self.bars)
        self.canvas.ci.layout.setRowStretchFactor(0, 3)
        self.canvas.ci.layout.setRowStretchFactor(1, 1)
        self.finish_layout(None)
        self.data = None  # LayerNorms of the result on screen
        self._for = None
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.attention_ready.connect(self.refresh)
        state.selection_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(self.refresh)

    def refresh(self, *_):
        self.readout.setText("")
        r = self.result_to_draw()
        if r is None:
            return
        if self._for is r and self.data is not None:
            self._draw()
            return
        self.data, self._for = None, None
        self.caption.setText("")
        self.stack.show_message("Measuring value norms (one more forward pass)…")
        x, kw = self.state.run_input()
        if not self.slot.start(norms_job, x, kw, None, on_result=lambda d: self._arrived(r, d), state=self.state):
            self.stack.show_message("Load a model to measure value norms.")

    def _arrived(self, r, data) -> None:
        if r is not self.state.result:
            return
        if list(data.tokens) != list(r.tokens):
            return  # the input changed while the norms were measured; the new result asks again
        self.data, self._for = data, r
        self._draw()

    def _failed(self, message: str) -> None:
        self.stack.show_message(message)
        self.state.error_raised.emit(message)

    def _draw(self) -> None:
        st, d = self.state, self.data
        self.stack.show_canvas()
        l, h = min(st.layer, len(d.layers) - 1), st.head
        a, nrm, fx = d.attentions[l, h], d.norms[l, h], d.value_norms[l, h]
        tok = d.tokens
        self.raw.show(a, tok, tok, (0.0, peak(a)), st.colormap, title=f"raw weight α — L{l} H{h}")
        self.norm.show(nrm, tok, tok, (0.0, peak(nrm)), st.colormap, title=f"‖α · f(x)‖ — L{l} H{h}")
        n = len(tok)
        self.bars.setOpts(x=np.arange(n) + 0.5, height=fx, width=0.8)
        self.bar_axis.set_labels(tok)
        self.bars_plot.setRange(xRange=(0, n), yRange=(0, peak(fx)), padding=0.02)
        self.bars_plot.setTitle(f"length of each token's transformed value f(x_j) in L{l} H{h}")
        norms = calc("norms")
        raw_share, norm_share = norms.special_share(a, d.special), norms.special_share(nrm, d.special)
        sink = ("special tokens" if np.any(d.special) else "no special tokens")
        self.caption.setText(
            f"<b>Value-weighted norms</b> (Kobayashi et al. 2020) — each map scaled to its own maximum. In L{l} H{h} "
            f"the raw weights put <b>{raw_share:.0%}</b> on {sink}; the norms put <b>{norm_share:.0%}</b> there. "
            "Where the right map is darker than the left, the weight moves little." + untrained_tag(st.info))

    def _hovered(self, pos) -> None:
        d = self.data
        if d is None:
            return
        for panel in (self.raw, self.norm):
            hit = panel.cell_at(pos)
            if hit is not None:
                i, j = hit
                l, h = min(self.state.layer, len(d.layers) - 1), self.state.head
                self.readout.setText(f'query "{d.tokens[i]}" → key "{d.tokens[j]}": α = {d.attentions[l, h, i, j]:.3f}, '
                                     f'‖α f(x)‖ = {d.norms[l, h, i, j]:.3f} (‖f(x)‖ = {d.value_norms[l, h, j]:.2f})')
                return
