"""Lesson page "order": shuffle the words; without positions the outputs only move, with them they change.

The numbers come from `lessons.order` (the textbook models, untrained, and core's sinusoidal table),
computed in workers (lanes "lesson-order" and "lesson-order-encoding", newest wins). Below, the sinusoidal
encoding itself (position × dimension) and how alike two positions' vectors are (their dot product).
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QBoxLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QWidget

from superqt.utils import signals_blocked

from attn_explorer.gui.widgets.heatmap import colormap
from attn_explorer.gui.widgets.tables import explanation, message_label, scrolling_page
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

INTRO = (
    "<b>Attention does not see word order.</b> Each output is a weighted average, and the weights depend "
    "only on what the tokens are, not on where they stand. Shuffle the words: without positions, every "
    "output just moves with its word. Undo the shuffle and they are the same numbers, up to rounding "
    "(about 10⁻⁷). The <i>set</i> of outputs does not change.<br>"
    "The fix is to add a position vector to each word vector before the first layer. The primer's "
    "choice is the <i>sinusoidal encoding</i>: PE[p, 2i] = sin(p / 10000<sup>2i/d</sup>), "
    "PE[p, 2i+1] = cos(same), for position p and dimension pair i. With it, a shuffle changes the outputs.<br>"
    "Both models here are the explorer's <i>textbook</i> transformers (2 layers, 4 heads, d = 64), "
    "<b>untrained</b>: seeded random weights. They show the mechanics, not language."
)
SIDE_BY_SIDE_PX = 760
LANE, ENCODING_LANE = "lesson-order", "lesson-order-encoding"  # the two heatmaps sit side by side on a page at least this wide


def _heat_plot(title: str, x_label: str, y_label: str) -> tuple[pg.PlotWidget, pg.ImageItem, pg.ColorBarItem]:
    """A heatmap after pyqtgraph's MatrixDisplayExample: row-major image, y down, one colour bar."""
    w = pg.PlotWidget(title=title)
    w.setMinimumSize(220, 260)
    p = w.getPlotItem()
    p.invertY(True)
    p.setLabel("bottom", x_label)
    p.setLabel("left", y_label)
    p.setMouseEnabled(False, False)
    p.hideButtons()
    img = pg.ImageItem(axisOrder="row-major")
    p.addItem(img)
    bar = pg.ColorBarItem(values=(-1, 1), colorMap=colormap("CET-D1") if "CET-D1" in pg.colormap.listMaps()
                          else colormap("viridis"), interactive=False, width=12)
    bar.setImageItem(img, insert_in=p)
    return w, img, bar


class OrderLesson(QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.lanes = (LANE, ENCODING_LANE)
        self.check = None  # the ShuffleCheck on screen
        self.seed = 0
        lay = scrolling_page(self)
        lay.addWidget(explanation(INTRO))

        row = QHBoxLayout()
        row.addWidget(QLabel("Sentence:"))
        self.text = QLineEdit(L.order.DEFAULT_TEXT)
        self.text.setCursorPosition(0)
        self.text.setToolTip("Words and punctuation marks are the textbook model's tokens")
        row.addWidget(self.text, 1)
        self.shuffle_btn = QPushButton("Shuffle")
        self.shuffle_btn.setToolTip("A new random order of the same words")
        row.addWidget(self.shuffle_btn)
        lay.addLayout(row)
        self.message = message_label()
        lay.addWidget(self.message)
        self.order_label = explanation("")
        lay.addWidget(self.order_label)
        self.nopos_label = explanation("")
        self.pos_label = explanation("")
        lay.addWidget(self.nopos_label)
        lay.addWidget(self.pos_label)

        lay.addWidget(explanation(
            "<b>The sinusoidal encoding.</b> Each row is one position's vector. Early dimensions swing fast, "
            "late ones slowly, so every position gets its own pattern. On the right, PE[p]·PE[q]: the "
            "diagonal is d/2 (each sin² + cos² pair adds 1), and near positions are more alike than far ones."))
        knobs = QHBoxLayout()
        self.positions = QSpinBox()
        self.positions.setRange(2, 512)
        self.positions.setValue(50)
        self.positions.setPrefix("positions: ")
        self.dims = QSpinBox()
        self.dims.setRange(2, 512)
        self.dims.setSingleStep(2)
        self.dims.setValue(64)
        self.dims.setPrefix("d = ")
        self.dims.setToolTip("The vector size; an even number (sin and cos pairs)")
        for w in (self.positions, self.dims):
            knobs.addWidget(w)
        knobs.addStretch(1)
        lay.addLayout(knobs)
        self.table_plot, self.table_img, self.table_bar = _heat_plot("PE[position, dimension]", "dimension",
                                                                     "position")
        self.sim_plot, self.sim_img, self.sim_bar = _heat_plot("PE[p] · PE[q]", "position q", "position p")
        plots = QBoxLayout(QBoxLayout.TopToBottom)  # side by side on a wide page (see resizeEvent)
        plots.addWidget(self.table_plot)
        plots.addWidget(self.sim_plot)
        self.plots = plots
        lay.addLayout(plots)
        self.encoding_note = explanation("")
        lay.addWidget(self.encoding_note)
        lay.addStretch(1)

        self.shuffle_btn.clicked.connect(self.shuffle)
        self.text.editingFinished.connect(self.recompute)
        self.positions.valueChanged.connect(self.draw_encoding)
        self.dims.valueChanged.connect(self.draw_encoding)
        self.recompute()
        self.draw_encoding()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        wide = event.size().width() >= SIDE_BY_SIDE_PX
        self.plots.setDirection(QBoxLayout.LeftToRight if wide else QBoxLayout.TopToBottom)

    # ------------------------------------------------------------------ the shuffle
    def shuffle(self) -> None:
        self.seed += 1
        self.recompute()

    def recompute(self) -> None:
        self.message.setText("Computing…")
        self.state.submit(L.shuffle_check, self.text.text(), self.seed, key=LANE, uses_model=False,
                          on_result=self._checked, on_error=self._clear)

    def _checked(self, c) -> None:
        self.check = c
        self.message.setText("")
        words = " ".join(html.escape(w) for w in c.words)
        shuffled = " ".join(f"{html.escape(w)}<sub>{i}</sub>" for w, i in zip(c.shuffled, c.perm))
        self.order_label.setText(
            f"<b>Words:</b> {words}<br><b>Shuffled</b> (small number: where the word stood): {shuffled}<br>"
            f"<b>Order:</b> [{', '.join(str(i) for i in c.perm)}]")
        self.nopos_label.setText(
            f"<b>Without positions</b> (textbook-nopos, untrained): largest difference between each shuffled "
            f"output and its word's original output = <b>{c.diff_nopos:.1e}</b>. "
            + ("Only rounding: the outputs moved with their words." if c.diff_nopos < 1e-4 else
               "Not only rounding.") + f" The set of outputs differs by {c.set_diff_nopos:.1e}.")
        self.pos_label.setText(
            f"<b>With sinusoidal positions</b> (textbook, untrained): the same comparison gives "
            f"<b>{c.diff_pos:.3g}</b>. " + ("The outputs changed: now the model can tell the orders apart."
                                            if c.diff_pos > 1e-3 else "Almost no change."))

    def _clear(self, message: str) -> None:
        self.check = None
        self.message.setText(message)
        for lab in (self.order_label, self.nopos_label, self.pos_label):
            lab.setText("")

    # ------------------------------------------------------------------ the encoding
    def draw_encoding(self) -> None:
        n, d = self.positions.value(), self.dims.value()
        if d % 2:
            d += 1
            with signals_blocked(self.dims):
                self.dims.setValue(d)
        self.state.submit(L.encoding, n, d, key=ENCODING_LANE, uses_model=False,
                          on_result=lambda answer: self._draw_encoding(n, d, *answer),
                          on_error=self.message.setText)

    def _draw_encoding(self, n: int, d: int, pe, sim) -> None:
        self.pe, self.sim = pe, sim
        self.table_img.setImage(pe, autoLevels=False)
        self.table_bar.setLevels(values=(-1.0, 1.0))
        self.sim_img.setImage(sim, autoLevels=False)
        peak = float(np.abs(sim).max())
        self.sim_bar.setLevels(values=(-peak, peak))
        for p in (self.table_plot, self.sim_plot):
            p.getPlotItem().autoRange(padding=0)
        self.encoding_note.setText(f"{n} positions × {d} dimensions; PE[p]·PE[p] = {sim[0, 0]:.1f} = d/2, "
                                   f"PE[0]·PE[1] = {sim[0, 1]:.1f}, PE[0]·PE[{n - 1}] = {sim[0, n - 1]:.1f}")
