"""Lesson page "block": the pre-LN Transformer block as a diagram, with each tensor's shape and size.

Top: one untrained block (core's TransformerBlock, seeded) on the sentence in the Text box, drawn
x → LN → MHA → + → LN → MLP → +, each arrow labelled with the tensor's shape and mean token length
(`lessons.block.trace_block`, lane "lesson-block"). Bottom: the residual stream's size at every
layer boundary of the loaded model (`lessons.block.stream_norms`, one forward pass, lane
"lesson-block-stream"). Both run in workers, newest wins.

The lesson block reads the textbook model's tokens (one per word or punctuation mark, no [CLS]); the
loaded model has its own tokenizer. So the page counts the block's input in *words* and the stream's
in the loaded model's *tokens* (specials included), the same count as the side panel's "Showing text".
"""
from __future__ import annotations

import html

import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QPainter, QPen
from PySide6.QtWidgets import QGraphicsScene, QGraphicsView, QWidget

from attn_explorer.gui.widgets.tables import explanation, message_label, scrolling_page
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

INTRO = (
    "<b>The Transformer block.</b> A block has two parts. <i>Multi-head attention</i> (MHA) lets tokens "
    "share information. The <i>MLP</i> then works on each token alone. Before each part, <i>LayerNorm</i> "
    "(LN) rescales every token vector to mean 0 and spread 1. After each part, its output is <i>added</i> "
    "to what went in: the <i>residual connection</i>. The running sum is the <i>residual stream</i>.<br>"
    "The primer's block is <i>pre-LN</i>: x = x + MHA(LN(x)), then x = x + MLP(LN(x)). Below, one such "
    "block (d = 64, 4 heads, MLP width 256, <b>untrained</b>: seeded random weights) reads the sentence in "
    "the Text box, each word embedded the textbook way (its word vector plus its sinusoidal position). "
    "Beside each arrow: the tensor's shape (tokens, numbers per token) and ‖·‖, the average length of "
    "one token's vector."
)
LANE, STREAM_LANE = "lesson-block", "lesson-block-stream"
BOX_W, BOX_H, STEP = 170, 30, 50  # diagram geometry, px
BOXES = [  # (label, point key of the arrow that leaves it, fill)
    ("input x", "x", "#eeeeee"),
    ("LayerNorm₁", "ln1", "#fff3c4"),
    ("Multi-head attention", "mha", "#cfe3ff"),
    ("⊕  add", "res1", "#ffffff"),
    ("LayerNorm₂", "ln2", "#fff3c4"),
    ("MLP: W₁, GELU", "hidden", "#d8f0d2"),
    ("MLP: W₂", "mlp", "#d8f0d2"),
    ("⊕  add", "res2", "#ffffff"),
]


class BlockDiagram(QGraphicsView):
    """The block drawn top to bottom; `set_points` writes each arrow's shape and norm."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.setRenderHint(QPainter.Antialiasing)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setFrameShape(QGraphicsView.NoFrame)
        self.annotations: dict[str, object] = {}
        self._draw()
        self.setMinimumHeight(200)

    def _draw(self) -> None:
        s = self.scene()
        pen = QPen(QColor("#333"), 1.4)
        bold = QFont()
        bold.setBold(True)
        x0 = 60  # boxes' left edge; the residual lines run left of them
        centre = x0 + BOX_W / 2
        ys = [i * STEP for i in range(len(BOXES))]
        for (label, key, fill), y in zip(BOXES, ys):
            adder = label.startswith("⊕")
            w = 60 if adder else BOX_W
            rect = QRectF(centre - w / 2, y, w, BOX_H)
            if adder:
                s.addEllipse(rect, pen, QBrush(QColor(fill)))
            else:
                s.addRect(rect, pen, QBrush(QColor(fill)))
            t = s.addText(label, bold if not adder else QFont())
            t.setPos(centre - t.boundingRect().width() / 2, y + (BOX_H - t.boundingRect().height()) / 2)
            # the arrow down to the next box, and its annotation
            s.addLine(centre, y + BOX_H, centre, y + STEP, pen)
            s.addLine(centre, y + STEP, centre - 4, y + STEP - 6, pen)
            s.addLine(centre, y + STEP, centre + 4, y + STEP - 6, pen)
            note = s.addText("")
            note.setDefaultTextColor(QColor("#1a4a8a"))
            note.setPos(centre + BOX_W / 2 + 12, y + BOX_H - 6)
            self.annotations[key] = note
        out = s.addText("output: the next block's x")
        out.setPos(centre - out.boundingRect().width() / 2, ys[-1] + STEP + 2)
        # residual connections: from the stream (x, then the first sum) around each part, into its ⊕
        for start, end, side in ((0, 3, 20), (3, 7, 36)):
            y1, y2 = ys[start] + BOX_H + 8, ys[end] + BOX_H / 2
            path = [(centre, y1), (side, y1), (side, y2), (centre - 30, y2)]
            for (ax, ay), (bx, by) in zip(path, path[1:]):
                s.addLine(ax, ay, bx, by, QPen(QColor("#b03030"), 1.4, Qt.DashLine))
            s.addLine(centre - 30, y2, centre - 36, y2 - 4, QPen(QColor("#b03030"), 1.4))
            s.addLine(centre - 30, y2, centre - 36, y2 + 4, QPen(QColor("#b03030"), 1.4))
        skip = s.addText("residual")
        skip.setDefaultTextColor(QColor("#b03030"))
        skip.setRotation(-90)
        skip.setPos(0, ys[2] + 40)
        self.setSceneRect(s.itemsBoundingRect().adjusted(-4, -4, 150, 4))

    def set_points(self, points) -> None:
        """points: lessons.block.Point list, or None to clear."""
        for key, note in self.annotations.items():
            note.setPlainText("")
        for p in points or []:
            shape = "×".join(str(d) for d in p.shape)
            self.annotations[p.key].setPlainText(f"({shape})  ‖·‖ = {p.norm:.2f}")

    def note_text(self, key: str) -> str:
        return self.annotations[key].toPlainText()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        rect = self.sceneRect()
        if event.size().width() < rect.width() or event.size().height() < rect.height():
            self.fitInView(rect, Qt.KeepAspectRatio)
        else:
            self.resetTransform()

    def sizeHint(self):  # noqa: N802
        r = self.sceneRect()
        return r.size().toSize()


class BlockLesson(QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.lanes = (LANE, STREAM_LANE)
        self.trace = None  # BlockTrace on screen
        self.stream = None  # StreamNorms on screen
        lay = scrolling_page(self)
        lay.addWidget(explanation(INTRO))
        self.message = message_label()
        lay.addWidget(self.message)
        self.words_label = explanation("")
        lay.addWidget(self.words_label)
        self.diagram = BlockDiagram()
        self.diagram.setMinimumHeight(int(self.diagram.sceneRect().height()) // 2)
        self.diagram.setFixedHeight(int(self.diagram.sceneRect().height()))
        lay.addWidget(self.diagram)
        self.reading = explanation(
            "<b>Reading it.</b> LN sets every token's length to about √d = 8. The two branches add small "
            "changes, so the stream after a block is close to what went in: each block edits the stream, "
            "it does not replace it.")
        lay.addWidget(self.reading)

        lay.addWidget(explanation("<b>The residual stream of the loaded model</b>: the average token length "
                                  "before the first block and after each block, for the current input."))
        self.form_label = explanation("")
        lay.addWidget(self.form_label)
        self.stream_plot = pg.PlotWidget()
        self.stream_plot.setMinimumSize(220, 220)
        self.stream_plot.setMaximumHeight(300)
        p = self.stream_plot.getPlotItem()
        p.setLabel("bottom", "after block (0 = before the first)")
        p.setLabel("left", "mean ‖token‖")
        p.showGrid(x=False, y=True, alpha=0.25)
        p.setMouseEnabled(False, False)
        p.hideButtons()
        lay.addWidget(self.stream_plot)
        self.stream_values = explanation("")
        lay.addWidget(self.stream_values)
        lay.addStretch(1)

        state.attention_ready.connect(self.refresh)
        state.model_loading.connect(self._model_loading)
        self.refresh()

    # ------------------------------------------------------------------ the lesson block
    def refresh(self, *_) -> None:
        """Redraw both halves for the current text and model."""
        self.recompute_block()
        self.request_stream()

    def recompute_block(self) -> None:
        self.words_label.setText("Computing…")
        self.state.submit(L.trace_block, self.state.text, key=LANE, uses_model=False, on_result=self._traced,
                          on_error=self._not_traced)

    def _not_traced(self, message: str) -> None:
        self.trace = None
        self.message.setText(message)
        self.words_label.setText("")
        self.diagram.set_points(None)

    def _traced(self, t) -> None:
        self.trace = t
        self.message.setText("")
        n = len(t.words)
        cut = f" (the first {L.block.MAX_WORDS})" if n >= L.block.MAX_WORDS else ""
        self.words_label.setText(
            f"<b>Input</b>: {n} word{'s' if n != 1 else ''}{cut}, one vector each (the lesson block splits the "
            "text into words and punctuation marks, with no [CLS]; the loaded model's own tokens are below): "
            + html.escape(" ".join(t.words[:40])) + (" …" if n > 40 else ""))
        self.diagram.set_points(t.points)

    # ------------------------------------------------------------------ the loaded model
    def _model_loading(self, *_) -> None:
        self.state.cancel(STREAM_LANE)  # an answer for the old model is no longer wanted
        self._show_stream(None, "Loading the model…")

    def request_stream(self) -> None:
        x, kw = self.state.run_input()
        if not self.state.has_model or x is None:
            self.state.cancel(STREAM_LANE)
            self._show_stream(None, "No model loaded yet.")
            return
        self._show_stream(None, "Measuring…")  # the old numbers describe another input
        self.state.submit(L.stream_norms, x, kw, key=STREAM_LANE, on_result=self._show_stream,
                          on_error=lambda m: self._show_stream(None, f"Could not measure the residual stream: {m}"))

    def _show_stream(self, s, message: str = "") -> None:
        self.stream = s
        p = self.stream_plot.getPlotItem()
        p.clear()
        if s is None:
            self.form_label.setText(message)
            self.stream_values.setText("")
            return
        trained = "trained" if s.trained else "<b>untrained</b>"
        if s.norm_first:
            form = ("is <b>pre-LN</b> (norm_first = True), like the primer's block: LN sits inside each branch, "
                    "so nothing rescales the stream itself and its length can grow block after block.")
        else:
            form = ("is <b>post-LN</b> (norm_first = False), like the original Transformer and BERT: "
                    "x = LN(x + MHA(x)), then x = LN(x + MLP(x)). A LayerNorm ends every block, so each block "
                    "sets the stream's length anew (to its learned scale) instead of letting it grow.")
        self.form_label.setText(f"<b>{html.escape(s.model)}</b> ({trained}) {form}")
        xs = list(range(len(s.norms)))
        p.plot(xs, s.norms, pen=pg.mkPen("#1f77b4", width=2), symbol="o", symbolSize=7, symbolBrush="#1f77b4",
               symbolPen=None)
        p.setXRange(-0.3, len(s.norms) - 0.7, padding=0)
        p.getAxis("bottom").setTicks([[(i, str(i)) for i in xs]])
        p.enableAutoRange(axis="y")
        p.setYRange(0, max(s.norms) * 1.1, padding=0)
        values = ", ".join(f"{v:.2f}" for v in s.norms)
        self.stream_values.setText(f"{len(s.norms)} values ({len(s.norms) - 1} blocks + the input), "
                                   f"{s.num_tokens} tokens (the model's own, specials included): {values}")
