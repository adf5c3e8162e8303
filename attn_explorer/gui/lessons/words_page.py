"""The frame the "projections" and "multi-head" lessons share: typed words become the rows of X (a fixed
random vector per word), a seed picks the random W matrices, and a bad cell gives one line on the page
while the last good numbers stay.

A page built on it lays out the shared widgets, adds its own, calls `start()`, and supplies
`compute(x, w)` and `_show(result, w)`.
"""
from __future__ import annotations

from PySide6.QtWidgets import QLineEdit, QPushButton, QSpinBox, QWidget

from attn_explorer.errors import UserError, error_message
from attn_explorer.gui.widgets.tables import KEPT_NOTE, EditableTable, MatrixBox, message_label
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

DIMS = ["1", "2", "3", "4"]  # the 4 numbers of each word's vector


class WordsPage(QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.proj = L.calc("projections")
        self.result = None  # the last good result of compute()
        self.words = QLineEdit(self.proj.DEFAULT_WORDS)
        self.seed = QSpinBox()
        self.seed.setRange(0, 99999)
        self.seed.setPrefix("seed ")
        self.reroll = QPushButton("Re-roll W")
        self.message = message_label()
        self.x_table = EditableTable()
        self.x_box = MatrixBox("X", self.x_table)

    def start(self) -> None:
        """Wire the shared inputs and show the default words (the page's own widgets are built by now)."""
        self.words.editingFinished.connect(self.load_words)
        self.seed.valueChanged.connect(self.recompute)
        self.reroll.clicked.connect(lambda: self.seed.setValue(self.seed.value() + 1))
        self.x_table.edited.connect(self.recompute)
        self.load_words()

    def load_words(self) -> None:
        try:
            words, x = self.proj.word_vectors(self.words.text())
        except UserError as exc:
            self.message.setText(error_message(exc) + KEPT_NOTE)
            return
        self.x_table.set_matrix(x, words, DIMS)
        self.recompute()

    def tokens(self) -> list[str]:
        return self.x_table.row_labels()

    def recompute(self, *_) -> None:
        try:
            x = L.calc("by-hand").parse_table(self.x_table.texts(), "X")
            w = self.proj.random_weights(self.seed.value())
            result = self.compute(x, w)
        except UserError as exc:
            self.message.setText(error_message(exc) + KEPT_NOTE)
            return
        self.message.setText("")
        self.result = result
        self._show(result, w)
