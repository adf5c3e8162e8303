"""The frame the "projections" and "multi-head" lessons share: typed words become the rows of X (a fixed
random vector per word), a seed picks the random W matrices, and a bad cell gives one line on the page
while the last good numbers stay.

A page built on it lays out the shared widgets, adds its own, calls `start()`, and supplies `job()`
(the `session.lessons` function and its arguments after X's cells and the seed) and `_show(result, w)`.
Every computation runs in a worker, in the page's lane (`state.submit`, newest wins): the words' vectors
in `<lane>-words`, the numbers in `<lane>`.
"""
from __future__ import annotations

from PySide6.QtWidgets import QLineEdit, QPushButton, QSpinBox, QWidget

from attn_explorer.gui.widgets.tables import KEPT_NOTE, EditableTable, MatrixBox, message_label
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

DIMS = ["1", "2", "3", "4"]  # the 4 numbers of each word's vector


class WordsPage(QWidget):
    LANE = "lesson-words"  # each page names its own

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.lanes = (self.LANE, self.LANE + "-words")
        self.result = None  # the last good result of the job
        self.words = QLineEdit(L.projections.DEFAULT_WORDS)
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
        self.state.submit(L.word_matrix, self.words.text(), key=self.LANE + "-words", uses_model=False,
                          on_result=self._words_ready, on_error=self._refused)

    def _words_ready(self, answer) -> None:
        words, x = answer
        self.x_table.set_matrix(x, words, DIMS)
        self.recompute()

    def tokens(self) -> list[str]:
        return self.x_table.row_labels()

    def job(self) -> tuple:
        """(fn, *extra args) for `state.submit`: fn(X's cell texts, seed, *extra) -> (result, Weights)."""
        raise NotImplementedError

    def recompute(self, *_) -> None:
        fn, *extra = self.job()
        tokens = self.tokens()
        self.state.submit(fn, self.x_table.texts(), self.seed.value(), *extra, key=self.LANE, uses_model=False,
                          on_result=lambda answer: self._computed(answer, tokens), on_error=self._refused)

    def _computed(self, answer, tokens: list[str]) -> None:
        if tokens != self.tokens():
            return  # other words are on the way: their own job follows
        result, w = answer
        self.message.setText("")
        self.result = result
        self._show(result, w)

    def _refused(self, message: str) -> None:
        self.message.setText(message + KEPT_NOTE)
