"""The relevance page: which input tokens, or which patches of the picture, the model's output depends on.

Methods (session.relevance): gradient rollout (Chefer et al. 2021), a named subset of AttnLRP (Achtibat et
al. 2024), and, to compare with, attention rollout and the last layer's raw attention. What is explained
depends on the model: an image classifier's class logit, a decoder's next token, an encoder's similarity to a
reference sentence (the Target box). Each explanation is one forward and one backward pass in a worker,
with progress (layer by layer) and Cancel; text gets one bar per token, images a heat overlay.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import QComboBox, QLabel, QLineEdit, QPushButton, QWidget

from attn_explorer.gui.widgets.heatmap import TokenAxis, colormap, picture_panel, set_bar_label
from attn_explorer.gui.widgets.overlay import blend, heat_levels
from attn_explorer.gui.widgets.page import PageFrame
from attn_explorer.session.relevance import LANE, METHOD_TITLES, METHODS, relevance_job, target_hint, target_kind

POSITIVE, NEGATIVE = "#c44e52", "#4c72b0"  # for the target / against it
# families whose logits are soft-capped (tanh): ModelInfo does not say so yet, so the family is the sign
SOFT_CAPPED = ("gemma2",)
SHORT_TITLES = {"gradient_rollout": "Gradient rollout", "attnlrp": "AttnLRP (subset)", "rollout": "Rollout",
                "attention": "Raw attention"}


class RelevancePage(PageFrame):
    def __init__(self, state, parent: QWidget | None = None):
        # the canvas takes the room that is left: its own size hint must not make the page scroll at 1024×700
        super().__init__(state, None, parent, fill_height=240)
        self.method = QComboBox()
        for m in METHODS:
            self.method.addItem(SHORT_TITLES[m], m)
            self.method.setItemData(self.method.count() - 1, METHOD_TITLES[m], Qt.ItemDataRole.ToolTipRole)
        self.method.setToolTip("How relevance is measured (the caption below says what each one does)")
        self.target = QLineEdit()
        self.target.setToolTip("What is explained: a class (images), the next token (decoders) or a reference "
                               "sentence whose similarity is explained (encoders). Press Enter to explain it.")
        self.explain_button = QPushButton("Explain")
        for w, stretch in ((QLabel("Method"), 0), (self.method, 0), (QLabel("Target"), 0), (self.target, 1),
                           (self.explain_button, 0)):
            self.control_row.addWidget(w, stretch)
        self.unused_note(hide="relevance is drawn over every token", log="relevance is drawn as measured")
        self._build_plots()
        self.data = None  # the Relevance on screen
        self.shown_heat = None  # images: the (rows, cols) relevance drawn
        self._for = None  # (result, method, target) the data or the job in flight describe
        self.method.currentIndexChanged.connect(lambda *_: self.refresh())
        self.target.returnPressed.connect(self.refresh)
        self.explain_button.clicked.connect(self.refresh)
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.attention_ready.connect(self.refresh)
        state.model_loaded.connect(self._model_changed)
        state.options_changed.connect(self._redraw_if_drawn)
        self._model_changed(state.info)

    def _build_plots(self) -> None:
        self.token_axis = TokenAxis("bottom", rotate=True)
        self.bars_plot = self.canvas.addPlot(row=0, col=0, axisItems={"bottom": self.token_axis})
        self.bars_plot.setMenuEnabled(False)
        self.bars_plot.hideButtons()
        self.bars_plot.setMouseEnabled(x=False, y=False)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.8)
        self.bars_plot.addItem(self.bars)
        self.bars_plot.addLine(y=0, pen=pg.mkPen("#888"))
        self.bars_plot.getAxis("left").enableAutoSIPrefix(False)  # "relevance", not "relevance (x0.001)"
        self.picture, self.picture_img, self.pic_bar = picture_panel(self.canvas, 0, 1, self.state.colormap)

    # ---- what to explain ---------------------------------------------------------------------------------

    def settings(self) -> tuple[str, str]:
        return self.method.currentData(), self.target.text()

    def _model_changed(self, info) -> None:
        self.target.setPlaceholderText(target_hint(info))
        self.target.clear()  # a class or token of the previous model means nothing to this one
        self._clear("Waiting for the model's first run…" if info is not None else "Load a model to explain its output.")

    def _clear(self, message: str) -> None:
        self.data, self._for = None, None
        self.caption.setText("")
        self.readout.setText("")
        self.progress.hide()
        if message:
            self.stack.show_message(message)

    def refresh(self, *_) -> None:
        r = self.result_to_draw()
        if r is None:
            return
        key = (r,) + self.settings()
        if self._is_current(key):
            if self.data is not None:
                self._draw()
            return
        kind = target_kind(self.state.info)
        if kind == "none":
            self._clear("Relevance is not supported yet for encoder-decoders.")
            return
        if kind == "encoder" and not key[2].strip():
            self._clear("Type a reference sentence in Target and press Enter: for an encoder, relevance explains "
                        "how similar this text's sentence embedding is to that sentence's.")
            return
        self._start(key)

    def _is_current(self, key) -> bool:
        """key is what the page shows or waits for: the same result object (by identity: a RunResult holds
        arrays), method and target."""
        return self._for is not None and self._for[0] is key[0] and self._for[1:] == key[1:]

    def _start(self, key) -> None:
        r, method, target = key
        self._clear("")
        self._for = key
        self.stack.show_message(f"Explaining with {METHOD_TITLES[method]}…")
        self.progress.start("forward pass…", "%p %")
        x, kw = self.state.run_input()
        started = self.state.submit(relevance_job, x, kw, method, target, key=LANE,
                                    on_result=lambda d: self._arrived(key, d), on_error=lambda m: self._failed(key, m),
                                    on_progress=lambda f, m: self._progressed(key, f, m))
        if not started:
            self._for = None
            self.progress.hide()
            self.stack.show_message("Load a model to explain its output.")

    def cancel(self) -> None:
        """Stop the explanation in flight: nothing of it arrives; the page says so."""
        if not self.state.job_busy(LANE):
            return
        self.state.cancel(LANE)
        self._for = None
        self.progress.bar.setValue(0)
        self.progress.stopped("cancelled: press Explain to run it again")
        self.stack.show_message("Cancelled.")

    def _progressed(self, key, fraction: float, message: str) -> None:
        if not self._is_current(key):
            return
        self.progress.advance(fraction, message, say=True)

    def _arrived(self, key, data) -> None:
        if not self._is_current(key) or key[0] is not self.state.result:
            return
        self.data = data
        self.progress.advance(1.0)
        self.progress.finish("done: one forward pass" + ("" if data.method in ("rollout", "attention") else
                                                         " and one backward pass"))
        self._draw()

    def _failed(self, key, message: str) -> None:
        if not self._is_current(key):
            return
        self._clear("")
        self.show_failure(message)

    def _redraw_if_drawn(self, *_) -> None:
        if self.data is not None and self.isVisible():
            self._draw()

    # ---- drawing -------------------------------------------------------------------------------------------

    def _draw(self) -> None:
        d = self.data
        self.stack.show_canvas()
        image = (d.grid is not None or _on_picture(d)) and d.image is not None
        self.picture.setVisible(image)
        self.pic_bar.setVisible(image)
        self.bars_plot.setVisible(not image)
        if image:
            self._draw_picture(d)
        else:
            self._draw_bars(d)
        self.caption.setText(self._caption(d, image))

    def _draw_bars(self, d) -> None:
        n = len(d.tokens)
        s = np.asarray(d.scores, dtype=np.float64)
        brushes = [pg.mkBrush(POSITIVE if v >= 0 else NEGATIVE) for v in s]
        self.bars.setOpts(x=np.arange(n) + 0.5, height=s, width=0.8, brushes=brushes)
        self.token_axis.set_labels(list(d.tokens))
        lo, hi = min(0.0, float(s.min())), max(0.0, float(s.max()))
        if hi - lo <= 0:
            hi = 1e-6
        self.bars_plot.setRange(xRange=(0, n), yRange=(lo, hi), padding=0.05)
        self.bars_plot.setLabel("left", "relevance")
        self.bars_plot.setTitle(f"{METHOD_TITLES[d.method]}: {d.target}")

    def _draw_picture(self, d) -> None:
        st = self.state
        heat = _heat(d)
        shown = np.clip(heat, 0, None)  # the overlay draws what speaks for the class
        ih, iw = d.image.shape[:2]
        self.picture_img.setImage(blend(d.image, shown, st.alpha, st.colormap, log=False), levels=(0, 255),
                                  autoLevels=False)
        self.picture_img.setRect(QRectF(0, 0, iw, ih))
        self.picture.setRange(xRange=(0, iw), yRange=(0, ih), padding=0.02)
        self.pic_bar.setColorMap(colormap(st.colormap))
        self.pic_bar.setLevels(values=heat_levels(shown, False)[1])
        set_bar_label(self.pic_bar, "relevance (0 to 98th pct.)")
        self.picture.setTitle(f"{d.target}: {METHOD_TITLES[d.method]}")
        self.shown_heat = heat

    def _caption(self, d, image: bool) -> str:
        what = {
            "gradient_rollout": "each layer's maps weighted by the score's gradient, mean over heads of relu(∂y/∂A ⊙ A), "
                                "rolled up from the identity (R ← R + Ā·R); shown: the row the score reads, minus the "
                                "identity start",
            "attnlrp": "gradient × input at the first block's input, with AttnLRP's uniform rule on q·kᵀ, A·V and "
                       "the gated MLP, the identity rule on norms and activations"
                       + ("" if image else "; signed: blue bars speak against the target")
                       + ". A subset of AttnLRP" + (
                           ": the logit soft-cap of Gemma 2 keeps its plain gradient" if self._soft_capped() else ""),
            "rollout": "attention rollout, heads averaged, residual as half of every layer; no gradient",
            "attention": "the last layer's attention from the row(s) the score reads, mean over heads; no gradient",
        }[d.method]
        vlm = _on_picture(d)
        reads = ("[CLS]" if d.rows == [0] else "[CLS] and [DIST]") if image and not vlm else \
            ("the last token" if len(d.rows) == 1 else "every token (the mean-pooled embedding)")
        neg = ""
        if image and d.method == "attnlrp":
            s = np.asarray(_heat(d), dtype=np.float64)
            total = float(np.abs(s).sum()) or 1.0
            neg = f" Negative relevance (against the class) is not drawn: {float(-s[s < 0].sum()) / total:.0%} of Σ|R|."
        untrained = "" if self.state.info is None or self.state.info.trained else \
            " <b>Untrained model (random weights): the pattern means nothing.</b>"
        if vlm and not untrained and self.state.info.weights.startswith("from "):  # as the overlay page says it
            untrained = (" The app cannot tell whether a folder's weights were trained; the tiny test models hold "
                         "<b>random weights</b> (the pattern means nothing).")
        unit = "image token (drawn at its place in the picture)" if vlm else "patch" if image else "token"
        return (f"<b>Relevance</b> of each input {unit} for <b>{d.target}</b> "
                f"(= {d.value:.3f} on this input), read at {reads}. {METHOD_TITLES[d.method]}: {what}." + neg
                + untrained)

    def _soft_capped(self) -> bool:
        """The loaded model soft-caps its logits (only then does the caption speak of it)."""
        info = self.state.info
        return info is not None and info.family in SOFT_CAPPED

    def _hovered(self, pos) -> None:
        d = self.data
        if d is None or not self.bars_plot.isVisible():
            return
        vb = self.bars_plot.getViewBox()
        if not vb.sceneBoundingRect().contains(pos):
            return
        x = vb.mapSceneToView(pos).x()
        i = int(np.floor(x))
        if 0 <= i < len(d.tokens):
            self.readout.setText(f'"{d.tokens[i]}" (token {i}): relevance {float(d.scores[i]):.4g}')


def _on_picture(d) -> bool:
    """A vision-language model's relevance (analysis.relevance_vlm): its image tokens placed on the picture."""
    return getattr(d, "picture", None) is not None


def _heat(d) -> np.ndarray:
    """The (rows, cols) relevance drawn over the picture: the patches' (image models) or the image tokens' in
    place (vision-language models: tiles assembled, merges undone)."""
    if _on_picture(d):
        return np.asarray(d.picture, dtype=np.float32)
    return np.asarray(d.scores[d.patch_offset:], dtype=np.float32).reshape(d.grid)
