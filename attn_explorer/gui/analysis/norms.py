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
from attn_explorer.maths import clipped_label, clipped_values, kept_tokens, without_specials
from attn_explorer.session.analysis import norms_job, special_share
from attn_explorer.session.state import SessionState


class NormsPage(AnalysisPage):
    def __init__(self, state: SessionState, parent=None):
        super().__init__(state, parent)
        self.raw = HeatPanel(self.canvas, 0, 0, state.colormap, "weight α")
        self.norm = HeatPanel(self.canvas, 0, 1, state.colormap, "‖α f(x)‖")
        self.raw.plot.setLabel("left", "query")  # one axis title: the right map's rows are the same queries
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
        self.data = None  # LayerNorms of the result on screen
        self.shown = None  # (α, ‖α f(x)‖, ‖f(x)‖, tokens) of the head drawn, special tokens gone when hidden
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
        if not self.state.submit(norms_job, x, kw, None, key="analysis-norms", on_result=lambda d: self._arrived(r, d),
                                 on_error=self._failed):
            self.stack.show_message("Load a model to measure value norms.")

    def _arrived(self, r, data) -> None:
        if r is not self.state.result:
            return
        if list(data.tokens) != list(r.tokens):
            return  # the input changed while the norms were measured; the new result asks again
        self.data, self._for = data, r
        self._draw()

    def _draw(self) -> None:
        st, d = self.state, self.data
        self.stack.show_canvas()
        l, h = min(st.layer, len(d.layers) - 1), st.head
        a, nrm, fx = d.attentions[l, h], d.norms[l, h], d.value_norms[l, h]
        raw_share, norm_share = special_share(a, d.special), special_share(nrm, d.special)  # on every token
        kept = kept_tokens(d.special, len(d.tokens), st.hide_special)
        if len(kept) < len(d.tokens):  # hidden: α renormalised over the rest, and ‖α' f(x)‖ = α' ‖f(x)‖ with it
            a = without_specials(a, d.special)
            fx = fx[kept]
            nrm = a * fx[None, :]
        tok = [d.tokens[i] for i in kept]
        self.shown = (a, nrm, fx, tok)
        log = st.log_scale
        for panel, m, what, title in ((self.raw, a, "weight α", "raw weight α"),
                                      (self.norm, nrm, "‖α f(x)‖", "‖α · f(x)‖")):
            values, levels, _ = clipped_values(m, log)
            panel.show(values, tok, tok, levels, st.colormap, title=f"{title} — L{l} H{h}", label=clipped_label(what, log))
            panel.matrix = np.asarray(m)  # the read-out gives the values, not their logs
        n = len(tok)
        self.bars.setOpts(x=np.arange(n) + 0.5, height=fx, width=0.8)
        self.bar_axis.set_labels(tok)
        self.bars_plot.setRange(xRange=(0, n), yRange=(0, peak(fx)), padding=0.02)
        self.bars_plot.setTitle(f"length of each token's transformed value f(x_j) in L{l} H{h}")
        sink = ("special tokens" if np.any(d.special) else "no special tokens")
        hidden = (f" Special tokens hidden: {n} of {len(d.tokens)} tokens drawn, α renormalised over them "
                  "(the shares above count every token)." if n < len(d.tokens) else "")
        scale = "log₁₀, over 4 powers of ten below" if log else "from 0 to"
        self.caption.setText(
            f"<b>Value-weighted norms</b> (Kobayashi et al. 2020) — each map coloured {scale} its own 99th "
            f"percentile (its strongest 1% saturate). In L{l} H{h} the raw weights put <b>{raw_share:.0%}</b> on {sink}; "
            f"the norms put <b>{norm_share:.0%}</b> there. Where the right map is darker than the left, the weight moves "
            "little." + hidden + untrained_tag(st.info))

    def _hovered(self, pos) -> None:
        if self.shown is None:
            return
        a, nrm, fx, tok = self.shown
        for panel in (self.raw, self.norm):
            hit = panel.cell_at(pos)
            if hit is not None:
                i, j = hit
                self.readout.setText(f'query "{tok[i]}" → key "{tok[j]}": α = {a[i, j]:.3f}, '
                                     f'‖α f(x)‖ = {nrm[i, j]:.3f} (‖f(x)‖ = {fx[j]:.2f})')
                return
