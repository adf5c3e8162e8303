"""The rollout page: how much each input token feeds each token at the top, through the residual stream.

Attention rollout (Abnar & Zuidema 2020) multiplies the layers' head-fused attention, each mixed half
and half with the identity (the residual), from layer 0 up to the selected layer or the last. Text:
the (N, N) rollout as a token heatmap. Images: the query's row over the picture (the [CLS] row
unless a patch was clicked on the Patch overlay page), drawn as the overlay page draws heat.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLabel

from attn_explorer.gui.analysis.common import AnalysisPage, HeatPanel, untrained_tag
from attn_explorer.gui.widgets.heatmap import colormap, picture_panel, set_bar_label
from attn_explorer.gui.widgets.overlay import blend, heat_label, heat_levels, patch_heat
from attn_explorer.maths import clipped_label, clipped_values, kept_tokens, rows_without_specials, without_specials
from attn_explorer.session.analysis import FUSIONS, long_rollout_job, rollout_job
from attn_explorer.session.mixers import recurrent_layers
from attn_explorer.session.state import SessionState
from attn_explorer.session.vlm import patch_grid_of


STRIP_HEIGHT = 360  # px: a long input's one rollout row is a strip this tall (title, row and token labels)


class RolloutPage(AnalysisPage):
    def __init__(self, state: SessionState, parent=None):
        # a long input's one rollout row: tiles from q and k, in a worker, on the frame's progress line
        super().__init__(state, parent, again="Start again")
        self.fusion = QComboBox()
        self.fusion.addItems(FUSIONS)
        self.fusion.setToolTip("How the heads of a layer become one map: their mean, max or min")
        self.discard = QDoubleSpinBox()
        self.discard.setRange(0.0, 0.95)
        self.discard.setSingleStep(0.05)
        self.discard.setDecimals(2)
        self.discard.setToolTip("Drop this fraction of the lowest weights in every layer (never a token's own)")
        self.upto = QCheckBox("only up to the selected layer")
        bar = self.control_row
        for w in (QLabel("heads fused by"), self.fusion, QLabel("discard lowest"), self.discard, self.upto):
            bar.addWidget(w)
        bar.addStretch(1)
        self.panel = HeatPanel(self.canvas, 0, 0, state.colormap, "rollout")
        self.panel.plot.setLabel("left", "token at the top (row)")
        self.panel.plot.setLabel("bottom", "input token (column)")
        self.picture, self.picture_img, self.pic_bar = picture_panel(self.canvas, 0, 1, state.colormap, "rollout")
        self._rolling: tuple | None = None  # the long request in flight, or the one that was stopped
        self.row: np.ndarray | None = None  # a long input's rollout row of the query (every token)
        self._row_for: tuple | None = None  # the request (result, fusion, discard, query, upto) it answers
        self.layers: np.ndarray | None = None  # (L, N, N) rollout through each layer
        self._for: tuple | None = None  # (result, fusion, discard) the layers describe
        self.shown: np.ndarray | None = None  # the (N, N) rollout of the layer on screen (every token)
        self.tokens: list[str] = []  # the tokens the text map labels (special ones gone when hidden)
        self.row_tokens: list[str] = []  # a long input's row label: the query token
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
        rec = recurrent_layers(self.state.info) if self.state.info is not None and self.state.info.name == r.model else []
        if rec:  # issue 25: rollout multiplies row-stochastic maps; a hybrid's recurrent layers are signed
            self.progress.finish()
            self.layers = self._for = None
            self.caption.setText("")
            self.stack.show_message(f"Attention rollout does not apply to this model: it multiplies each layer's "
                                    f"maps as probabilities (rows summing to 1, none below 0), and layers "
                                    f"{', '.join(map(str, rec))} are recurrent, with signed implicit maps.")
            return
        if r.is_lazy:
            self._roll_long(r)
            return
        self.progress.finish()
        self._rolling = self.row = self._row_for = None
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

    # ------------------------------------------------------------------------------- long inputs
    def long_request(self, r) -> tuple:
        """(store, fusion, discard, query, upto): what a long input's one rollout row depends on (the store, not
        the record: a record redrawn with other options shares it, so nothing is rolled out again)."""
        L = self.state.info.num_layers if self.state.info is not None else 1
        upto = min(self.state.layer, L - 1) if self.upto.isChecked() else None
        return (r.lazy, *self.settings(), min(self.state.query, r.num_tokens - 1), upto)

    def _roll_long(self, r) -> None:
        """A long input keeps no maps: roll out the query's row only, layer by layer from the top down, each
        layer's rows computed in tiles from q and k, in a worker with progress and cancel."""
        key = self.long_request(r)
        if _same(self._row_for, key) and self.row is not None:
            self._draw_row()
            return
        if _same(self._rolling, key):
            return  # in flight, or stopped by the user: a redraw does not start it again
        self.row, self._row_for = None, None
        self.caption.setText("")
        if key[2] > 0:
            self.progress.finish()
            self._rolling = None
            self.stack.show_message("Discarding the lowest weights needs each layer's whole map, which a long "
                                    "input does not keep: set discard lowest to 0 to roll this input out.")
            return
        self._rolling = key
        self.progress.start(f"Rolling out token {key[3]}'s row through the layers, in tiles from q and k…")
        self.stack.show_message(f"No maps were kept for this long input: the rollout of token {key[3]} "
                                f"(\u201c{r.tokens[key[3]].strip()}\u201d) is computed as one row, layer by layer "
                                "from the top down, each from that layer's q and k.")
        self.state.submit(long_rollout_job, r, key[3], key[1], key[2], key[4], key="analysis-rollout",
                          on_result=lambda row: self._row_arrived(key, row), on_error=self._failed_long,
                          on_progress=self.progress.advance, uses_model=False)

    def _row_arrived(self, key, row) -> None:
        now = self.state.result
        if now is None or not now.is_lazy or not _same(key, self.long_request(now)):
            return  # the request changed meanwhile: the newer one is on its way
        self.progress.finish()
        self.row, self._row_for, self._rolling = row, key, None
        self._draw_row()

    def cancel(self) -> None:
        self.state.cancel("analysis-rollout")
        self.progress.stopped("Stopped: this rollout row was not computed.")
        self.stack.show_message("Rolling out was stopped before it reached layer 0: nothing is shown. "
                                "Press Start again to start over.")

    def restart(self) -> None:
        self._rolling = None
        self.refresh()

    def _failed_long(self, message: str) -> None:
        self.progress.finish()
        self._rolling = None
        self._failed(message)

    def _draw_row(self) -> None:
        """The query's rollout row: over the picture for images, else a one-row strip over every token."""
        st, r = self.state, self.state.result
        _, fusion, _, q, upto = self._row_for
        self.stack.show_canvas()
        L = st.info.num_layers if st.info is not None else 1
        through = f"layers 0–{upto}" if upto is not None else f"all {L} layers"
        image = patch_grid_of(r) is not None and r.image is not None  # a vision-language run: tokens (issue 26 B)
        self.picture.setVisible(image)
        self.pic_bar.setVisible(image)
        self.panel.plot.setVisible(not image)
        log, hide = st.log_scale, st.hide_special
        how = (f"heads fused by {fusion}; one row, computed exactly in tiles from each layer's q and k "
               f"({r.num_tokens:,} tokens: no maps kept)")
        if image:
            self.shown = None
            self._draw_picture(self.row, q, through, how)
            return
        kept = kept_tokens(r.special, r.num_tokens, hide)
        row = rows_without_specials(self.row, r.special) if hide else self.row
        tokens = [r.tokens[i] for i in kept]
        values, levels, _top = clipped_values(row[None, :], log)
        self.panel.show(values, [r.tokens[q]], tokens, levels, st.colormap, title=f"rollout through {through}",
                        label=clipped_label("rollout", log))
        self.panel.matrix = np.asarray(row)[None, :]
        self.panel.plot.setLabel("left", "query")
        self._strip(True)  # one row: a strip across the top, not one cell the plot's height
        self.shown = None
        self.tokens, self.row_tokens = tokens, [r.tokens[q]]
        what = (f"How much of token {q} (\u201c{r.tokens[q]}\u201d)'s representation after {through} traces back "
                f"to each input token, with the residual counted as half of every layer ({how}). The row sums "
                "to 1. Pick another query on the token page.")
        self.caption.setText("<b>Attention rollout</b> — " + what + untrained_tag(st.info))

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
        image = patch_grid_of(r) is not None and r.image is not None  # a vision-language run: tokens (issue 26 B)
        self.picture.setVisible(image)
        self.pic_bar.setVisible(image)
        self.panel.plot.setVisible(not image)
        log, hide = st.log_scale, st.hide_special
        if image:
            q = min(st.query, r.num_tokens - 1)
            self._draw_picture(self.shown[q], q, through, how)
            return
        else:
            kept = kept_tokens(r.special, r.num_tokens, hide)
            shown = without_specials(self.shown, r.special) if hide else self.shown
            tokens = [r.tokens[i] for i in kept]
            values, levels, _top = clipped_values(shown, log)
            self.panel.plot.setLabel("left", "token at the top (row)")
            self._strip(False)
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

    def _strip(self, on: bool) -> None:
        """The map's row of the canvas as a short strip (a long input's one row) or at full height."""
        self.canvas.ci.layout.setRowMaximumHeight(0, STRIP_HEIGHT if on else 1e6)

    def _draw_picture(self, row: np.ndarray, q: int, through: str, how: str) -> None:
        """Query q's rollout row (every token) as heat over the picture, and the caption that says so."""
        st, r = self.state, self.state.result
        log, hide = st.log_scale, st.hide_special
        heat = patch_heat(row, r.grid, r.patch_offset, r.special if hide else None)
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
        self.caption.setText("<b>Attention rollout</b> — " + what + untrained_tag(st.info))

    def _hovered(self, pos) -> None:
        r = self.state.result
        hit = self.panel.cell_at(pos) if self.panel.plot.isVisible() else None
        if hit is None or r is None or self.panel.matrix is None:
            return
        i, j = hit
        top = self.row_tokens[i] if self.row is not None and self._row_for is not None else self.tokens[i]
        self.readout.setText(f'"{top}" at the top ← input "{self.tokens[j]}": {self.panel.matrix[i, j]:.3f}')


def _same(a: tuple | None, b: tuple) -> bool:
    """Two requests (results or stores first) are the same: the same object first and equal settings."""
    return a is not None and a[0] is b[0] and a[1:] == b[1:]
