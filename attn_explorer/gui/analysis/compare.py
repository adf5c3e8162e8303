"""The compare page: the selected head on two inputs (or two models), side by side, and B − A.

A is what the explorer shows now (the Text box's input, or the picture). B is another text (or image
file) run through the same model, or the same input through another model. The difference is signed:
red where B looks more, blue where A does. Only maps of the same shape can be subtracted; otherwise one
plain line on the canvas says why, once.

On open, B is the sample sentence's twin when A is the sample sentence (so the page shows a comparison at
once); otherwise the page waits for B and says so. Narrow windows put B − A under A and B.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QLabel, QLineEdit, QPushButton

from attn_explorer.gui.analysis.common import DIVERGING, AnalysisPage, HeatPanel, peak, symmetric
from attn_explorer.maths import LOG_FLOOR, kept_tokens, log_weights, without_specials
from attn_explorer.session.analysis import compare_job, load_and_run_job, mismatch, run_job
from attn_explorer.session.state import SAMPLE_TEXT, SessionState

DEFAULT_B = "The animal didn't cross the street because it was too wide."  # SAMPLE_TEXT, one word changed
NAMES = ("A (the Text box)", "B")
NAMES_IMAGE = ("A (the picture shown)", "B")
NARROW = 1000  # canvas pixels below which B − A goes under A and B instead of beside them


class ComparePage(AnalysisPage):
    def __init__(self, state: SessionState, parent=None):
        super().__init__(state, parent)
        self.b_input = QLineEdit("")
        self.b_input.setToolTip("B's input: text for a text model, an image file for an image model "
                                "(empty: the same input as A)")
        self.b_model = QLineEdit("")
        self.b_model.setPlaceholderText("same model")
        self.b_model.setMaximumWidth(200)
        self.b_model.setToolTip("B's model: a built-in name, a folder or a hub id (empty: A's model)")
        self.go = QPushButton("Compare")
        bar = self.control_row
        for w, stretch in ((QLabel("B:"), 0), (self.b_input, 1), (QLabel("model"), 0), (self.b_model, 0), (self.go, 0)):
            bar.addWidget(w, stretch)
        self.a = HeatPanel(self.canvas, 0, 0, state.colormap, "weight")
        self.b = HeatPanel(self.canvas, 0, 1, state.colormap, "weight")
        self.diff = HeatPanel(self.canvas, 0, 2, DIVERGING, "B − A")
        self.narrow: bool | None = None  # B − A under A and B (narrow canvas) or beside them
        self.unused_note(log="B − A stays on a plain scale (a difference can be negative); A and B use it")
        self.result_b = None  # RunResult of B
        self._b_for = None  # A's result when B was run
        self.delta = None  # (L, H, N, N) B − A, every token
        self.shown = None  # (A, B, B − A, tokens of A, tokens of B) of the head drawn
        self._asked_for = None  # A's result when B was last asked for
        self._other = None  # (source, model handle) of B's own model, once loaded
        self._offered = False  # B was filled in with the sample sentence's twin (once)
        self.go.clicked.connect(self.compare)
        self.b_input.returnPressed.connect(self.compare)
        self.b_model.returnPressed.connect(self.compare)
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        self.canvas.installEventFilter(self)
        state.attention_ready.connect(self._a_changed)
        state.model_loaded.connect(self._model_loaded)
        state.selection_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(self.refresh)

    # ------------------------------------------------------------------------------- layout
    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802 - Qt API
        if obj is self.canvas and ev.type() == QEvent.Resize:
            self.arrange(self.canvas.width() < NARROW)
        return super().eventFilter(obj, ev)

    def arrange(self, narrow: bool) -> None:
        """B − A beside A and B, or (narrow) under them, so all three stay on screen."""
        if narrow == self.narrow:
            return
        self.narrow = narrow
        layout = self.canvas.ci
        layout.removeItem(self.diff.plot)
        if narrow:
            layout.addItem(self.diff.plot, row=1, col=0)
        else:
            layout.addItem(self.diff.plot, row=0, col=2)

    # ------------------------------------------------------------------------------- B
    def names(self) -> tuple[str, str]:
        r = self.state.result
        return NAMES_IMAGE if r is not None and r.grid is not None else NAMES

    def _model_loaded(self, info) -> None:
        """A sentence is no input for an image model, nor a file name for a text model: offer the right kind."""
        image = info.modality == "image"
        if image and self.b_input.text() == DEFAULT_B:
            self.b_input.setText("")
        self.b_input.setPlaceholderText("an image file (empty: the same picture)" if image else
                                        "B's text: a sentence with as many tokens as A's")

    def _a_changed(self, *_):
        if self.result_b is not None and self._b_for is not self.state.result:
            self.compare()  # A moved on: run B again with the same settings
        else:
            self.refresh()

    def waiting_text(self) -> str:
        """What the canvas says before there is a B to show."""
        r = self.state.result
        na, _ = self.names()
        what = (f"{na}, {r.num_tokens} tokens" if r is not None and r.grid is None else na)
        return (f"Compare puts the selected head on two inputs side by side, with B − A: {what}, and B, typed "
                "above (a sentence with the same number of tokens, an image file, or the same input with another "
                "model named in the model box). Then press Compare.")

    def compare(self) -> None:
        """Run B (in a worker) and draw A, B and B − A when it arrives."""
        st = self.state
        if st.result is None:
            return
        x, kw = st.run_input()
        text = self.b_input.text().strip()
        src = self.b_model.text().strip()
        if not text and not src:
            self.stack.show_message(self.waiting_text())  # B would be A itself: nothing to compare yet
            return
        b_x = text or x
        a = self._asked_for = st.result
        self.result_b, self.delta, self.shown = None, None, None
        self.caption.setText("")
        self.stack.show_message("Running B…")
        lane = "analysis-compare"
        if src and self._other is not None and self._other[0] == src:
            st.submit(run_job, self._other[1], b_x, kw, key=lane, on_result=lambda rb: self._arrived(a, rb),
                      on_error=self._failed, uses_model=False)
        elif src:
            def loaded(pair):
                self._other = (src, pair[0])  # kept for the next comparison with this model
                self._arrived(a, pair[1])

            st.submit(load_and_run_job, src, st.device, b_x, kw, key=lane, on_result=loaded, on_error=self._failed,
                      uses_model=False)
        elif not st.submit(run_job, b_x, kw, key=lane, on_result=lambda rb: self._arrived(a, rb), on_error=self._failed):
            self.stack.show_message("Load a model to compare.")

    def _arrived(self, a, rb) -> None:
        if a is not self.state.result:
            return
        self.result_b, self._b_for = rb, a
        why = self.why_not()
        if why and not why.startswith("note"):
            self.refresh()  # it says why, and there is nothing to subtract
            return
        self.state.submit(compare_job, a.attentions, rb.attentions, key="analysis-compare-diff",
                          on_result=lambda d: self._diffed(a, rb, d), on_error=self._failed, uses_model=False)

    def _diffed(self, a, rb, delta) -> None:
        if a is not self.state.result or rb is not self.result_b:
            return
        self.delta = delta
        self.refresh()

    def why_not(self) -> str:
        a, b = self.state.result, self.result_b
        if a is None or b is None:
            return ""
        return mismatch(a.attentions, b.attentions, a.tokens, b.tokens, names=self.names())

    def _failed(self, message: str) -> None:
        self.caption.setText("")
        self.stack.show_message("B could not be run: the message at the top of the window says why.")
        self.state.error_raised.emit(message)

    # ------------------------------------------------------------------------------- drawing
    def refresh(self, *_):
        self.readout.setText("")
        a, b = self.result_to_draw(), self.result_b
        if a is None:
            return
        if b is None or self._b_for is not a:
            if self._asked_for is a or self.state.job_busy("analysis-compare"):
                return  # B is on its way
            if not self._offered and a.grid is None and not self.b_input.text().strip() \
                    and self.state.text == SAMPLE_TEXT:
                self._offered = True
                self.b_input.setText(DEFAULT_B)  # the sample sentence has a twin: show a comparison at once
                self.compare()
            else:
                self.caption.setText("")
                self.stack.show_message(self.waiting_text())
            return
        why = self.why_not()
        if why and not why.startswith("note"):
            self.delta = None
            self.caption.setText("")
            self.stack.show_message(why[0].upper() + why[1:] + ".")  # said once, where the maps would be
            return
        if self.delta is None:
            return  # the difference is on its way
        st = self.state
        l, h = st.layer, st.head
        ma, mb = a.attentions[l, h], b.attentions[l, h]
        ta, tb = list(a.tokens), list(b.tokens)
        if st.hide_special:
            ka, kb = kept_tokens(a.special, len(ta)), kept_tokens(b.special, len(tb))
            if len(ka) == len(kb):  # the same positions stay on both sides
                ma, mb = without_specials(ma, a.special), without_specials(mb, b.special)
                ta, tb = [ta[i] for i in ka], [tb[i] for i in kb]
        md = mb - ma
        self.shown = (ma, mb, md, ta, tb)
        top = max(peak(ma), peak(mb))
        log = st.log_scale
        levels = (max(LOG_FLOOR, float(np.log10(top)) + LOG_FLOOR), float(np.log10(top))) if log else (0.0, top)
        label = "log₁₀ weight" if log else "weight"
        self.stack.show_canvas()
        va, vb = (log_weights(ma), log_weights(mb)) if log else (ma, mb)
        # short titles: a title is as wide as its text at least, and three must fit in 600 px
        self.a.show(va, ta, ta, levels, st.colormap, title=f"A: {a.model}, L{l} H{h}", label=label)
        self.b.show(vb, tb, tb, levels, st.colormap, title=f"B: {b.model}, L{l} H{h}", label=label)
        self.diff.show(md, ta, ta, symmetric(md), DIVERGING, title="B − A (red: B more)")
        hidden = (f" Special tokens hidden: {len(ta)} of {a.num_tokens} tokens, rows renormalised."
                  if len(ta) < a.num_tokens else "")
        whole = float(abs(self.delta).sum(-1).mean() / 2)  # weight one row moves, averaged over every head
        self.caption.setText(f"<b>Compare</b> — {NAMES[0] if a.grid is None else NAMES_IMAGE[0]} and B share one "
                             f"colour scale. Largest change in L{l} H{h}: {float(abs(md).max()):.2f}; on average a row "
                             f"moves {float(abs(md).sum(-1).mean()) / 2:.0%} of its weight here and {whole:.0%} over "
                             "all heads. " + (why + "." if why else "") + hidden)

    def _hovered(self, pos) -> None:
        if self.shown is None:
            return
        ma, mb, md, ta, tb = self.shown
        for panel in (self.a, self.b, self.diff):
            hit = panel.cell_at(pos)
            if hit is not None:
                i, j = hit
                self.readout.setText(f'query "{ta[i]}" → key "{ta[j]}": A {ma[i, j]:.3f}, '
                                     f'B {mb[i, j]:.3f}, B − A {md[i, j]:+.3f}')
                return
