"""The compare page: the selected head on two inputs (or two models), side by side, and B − A.

A is what the explorer shows now. B is another text (or image file) run through the same model, or
the same input through another model. The difference is signed: red where B looks more, blue where A
does. Only maps of the same shape can be subtracted; otherwise one line says why.
"""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QPushButton

from attn_explorer.gui.analysis.common import DIVERGING, AnalysisPage, HeatPanel, peak, symmetric
from attn_explorer.session.analysis import AnalysisSlot, calc, load_and_run_job, run_job
from attn_explorer.session.state import SessionState

DEFAULT_B = "The animal didn't cross the street because it was too wide."


class ComparePage(AnalysisPage):
    def __init__(self, state: SessionState, parent=None):
        super().__init__(state, parent)
        self.slot = AnalysisSlot(self._failed)
        self.b_input = QLineEdit(DEFAULT_B)
        self.b_input.setToolTip("B's input: text for a text model, an image file for an image model "
                                "(empty: the same input as A)")
        self.b_model = QLineEdit("")
        self.b_model.setPlaceholderText("same model")
        self.b_model.setMaximumWidth(200)
        self.b_model.setToolTip("B's model: a built-in name, a folder or a hub id (empty: A's model)")
        self.go = QPushButton("Compare")
        bar = QHBoxLayout()
        for w, stretch in ((QLabel("B:"), 0), (self.b_input, 1), (QLabel("model"), 0), (self.b_model, 0), (self.go, 0)):
            bar.addWidget(w, stretch)
        self.a = HeatPanel(self.canvas, 0, 0, state.colormap, "weight")
        self.b = HeatPanel(self.canvas, 0, 1, state.colormap, "weight")
        self.diff = HeatPanel(self.canvas, 0, 2, DIVERGING, "B − A")
        self.finish_layout(bar)
        self.result_b = None  # RunResult of B
        self._b_for = None  # A's result when B was run
        self.delta = None  # (L, H, N, N) B − A
        self._asked_for = None  # A's result when B was last asked for
        self._other = None  # (source, model handle) of B's own model, once loaded
        self.go.clicked.connect(self.compare)
        self.b_input.returnPressed.connect(self.compare)
        self.b_model.returnPressed.connect(self.compare)
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.attention_ready.connect(self._a_changed)
        state.model_loaded.connect(self._model_loaded)
        state.selection_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(self.refresh)

    def _model_loaded(self, info) -> None:
        """A sentence is no input for an image model, nor a file name for a text model: offer the right kind."""
        image = info.modality == "image"
        if image and self.b_input.text() == DEFAULT_B:
            self.b_input.setText("")
        elif not image and not self.b_input.text().strip():
            self.b_input.setText(DEFAULT_B)
        self.b_input.setPlaceholderText("an image file (empty: the same image)" if image else "the same text as A")

    def _a_changed(self, *_):
        if self.result_b is not None and self._b_for is not self.state.result:
            self.compare()  # A moved on: run B again with the same settings
        else:
            self.refresh()

    def compare(self) -> None:
        """Run B (in a worker) and draw A, B and B − A when it arrives."""
        st = self.state
        if st.result is None:
            return
        x, kw = st.run_input()
        text = self.b_input.text().strip()
        b_x = text or x
        src = self.b_model.text().strip()
        a = self._asked_for = st.result
        self.result_b, self.delta = None, None
        self.caption.setText("")
        self.stack.show_message("Running B…")
        if src and self._other is not None and self._other[0] == src:
            self.slot.start(run_job, self._other[1], b_x, kw, on_result=lambda rb: self._arrived(a, rb))
        elif src:
            def loaded(pair):
                self._other = (src, pair[0])  # kept for the next comparison with this model
                self._arrived(a, pair[1])

            self.slot.start(load_and_run_job, src, st.device, b_x, kw, on_result=loaded)
        elif not self.slot.start(run_job, b_x, kw, on_result=lambda rb: self._arrived(a, rb), state=st):
            self.caption.setText("")

    def _arrived(self, a, rb) -> None:
        if a is not self.state.result:
            return
        self.result_b, self._b_for = rb, a
        self.refresh()

    def _failed(self, message: str) -> None:
        self.caption.setText(message)
        self.stack.show_message(message)

    def refresh(self, *_):
        self.readout.setText("")
        a, b = self.result_to_draw(), self.result_b
        if a is None:
            return
        if b is None or self._b_for is not a:
            if self._asked_for is not a and not self.slot.busy:
                self.compare()  # the page shows a comparison as soon as it is opened
            else:
                self.stack.show_message("Type B's input (and, if you like, another model) and press Compare.")
            return
        compare = calc("compare")
        why = compare.mismatch(a.attentions, b.attentions, a.tokens, b.tokens)
        if why and not why.startswith("note"):
            self.delta = None
            self.caption.setText(why)
            self.stack.show_message(why)
            return
        self.delta = compare.attention_diff(a.attentions, b.attentions)
        st = self.state
        l, h = st.layer, st.head
        ma, mb, md = a.attentions[l, h], b.attentions[l, h], self.delta[l, h]
        top = max(peak(ma), peak(mb))
        self.stack.show_canvas()
        self.a.show(ma, a.tokens, a.tokens, (0.0, top), st.colormap, title=f"A ({a.model}) — L{l} H{h}")
        self.b.show(mb, b.tokens, b.tokens, (0.0, top), st.colormap, title=f"B ({b.model}) — L{l} H{h}")
        self.diff.show(md, a.tokens, a.tokens, symmetric(md), DIVERGING, title="B − A (red: B looks more)")
        whole = float(abs(self.delta).sum(-1).mean() / 2)  # weight one row moves, averaged over every head
        self.caption.setText(f"<b>Compare</b> — A and B share one colour scale. Largest change in L{l} H{h}: "
                             f"{float(abs(md).max()):.2f}; on average a row moves {float(abs(md).sum(-1).mean()) / 2:.0%} "
                             f"of its weight here and {whole:.0%} over all heads. " + (why if why else ""))

    def _hovered(self, pos) -> None:
        if self.delta is None:
            return
        a, b = self.state.result, self.result_b
        for panel in (self.a, self.b, self.diff):
            hit = panel.cell_at(pos)
            if hit is not None:
                i, j = hit
                l, h = self.state.layer, self.state.head
                self.readout.setText(f'query "{a.tokens[i]}" → key "{a.tokens[j]}": A {a.attentions[l, h, i, j]:.3f}, '
                                     f'B {b.attentions[l, h, i, j]:.3f}, B − A {self.delta[l, h, i, j]:+.3f}')
                return
