"""Lesson page "coreference": find the heads that link "it" to "animal" rather than to "street".

The three pickers are filled from the current text's tokens (word pieces grouped into words). "Find
the heads" runs the loaded model once in a worker (`lessons.coreference.find_heads`, lane
"lesson-coreference") and ranks every
(layer, head); the best one is selected for the whole window, with "it" as the query, so the One head
view shows it at once. Any sentence and any three words work.
"""
from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QFormLayout, QHBoxLayout, QHeaderView, QPushButton,
                               QTableWidget, QTableWidgetItem, QWidget)
from superqt.utils import signals_blocked

from attn_explorer.gui.widgets.tables import explanation, message_label, scrolling_page
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

INTRO = (
    "<b>Finding the 'it' head.</b> In “The animal didn't cross the street because it was too tired.”, "
    "<i>it</i> is the animal. A model that reads this well needs somewhere to make that link. Each head "
    "gives <i>it</i> a row of weights over the tokens. For every head we read two of them, the weight from "
    "the <b>query</b> (<i>it</i>) to the <b>target A</b> (<i>animal</i>) and to the <b>rival B</b> "
    "(<i>street</i>), and rank the heads by A − B. One forward pass gives every head at once.<br>"
    "Pick any other words, or type another sentence in the Text box. A word cut into pieces counts as one: "
    "its pieces' weights are added (and, for the query, averaged). <i>others → A</i> is the weight every "
    "other token gives A, on average, in the same head: a head where everyone looks at A is not resolving "
    "<i>it</i>. In a decoder (smollm2) a token sees only the tokens before it: pick a target and a rival "
    "that come before the query."
)
LANE = "lesson-coreference"
COLUMNS = ["rank", "layer", "head", "A − B", "→ A", "→ B", "others → A"]


def _compared(others: float, query: float) -> str:
    """How the other tokens' weight to A compares with the query's, in words."""
    if others < 0.3 * query:
        return ": much less, so the link is special to the query."
    if others < 0.8 * query:
        return ": less, but the other tokens look at it too."
    return ": about as much, so this head looks at it from everywhere, not only from the query."


class CoreferenceLesson(QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.lanes = (LANE,)
        self.calc = L.coreference
        self.words = []  # Word list of the current tokens
        self.tokens: list[str] = []
        self.ranking = None  # the Ranking on screen
        self._ranked_with: tuple | None = None  # (text, run options) the ranking was made with
        lay = scrolling_page(self)
        lay.addWidget(explanation(INTRO))
        top = QHBoxLayout()
        self.primer_btn = QPushButton("Use the primer's sentence")
        self.primer_btn.setToolTip(self.calc.PRIMER_SENTENCE)
        top.addWidget(self.primer_btn)
        top.addStretch(1)
        lay.addLayout(top)
        form = QFormLayout()
        self.query = QComboBox()
        self.target = QComboBox()
        self.rival = QComboBox()
        for label, box in (("Query (the word that looks):", self.query), ("Target A (the right answer):", self.target),
                           ("Rival B (the wrong answer):", self.rival)):
            box.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
            box.setMinimumContentsLength(14)
            box.setMaximumWidth(380)
            form.addRow(label, box)
        lay.addLayout(form)
        buttons = QHBoxLayout()
        self.find_btn = QPushButton("Find the heads")
        self.open_btn = QPushButton("Show the best head in One head")
        self.open_btn.setToolTip("Switch to the One head tab, which now shows the selected head and query")
        buttons.addWidget(self.find_btn)
        buttons.addWidget(self.open_btn)
        buttons.addStretch(1)
        lay.addLayout(buttons)
        self.message = message_label()
        lay.addWidget(self.message)
        self.status = explanation("")
        lay.addWidget(self.status)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.setMinimumHeight(240)
        self.table.setToolTip("Double-click a row to show that head")
        lay.addWidget(self.table, 1)

        self.primer_btn.clicked.connect(lambda: state.set_text(self.calc.PRIMER_SENTENCE))
        self.find_btn.clicked.connect(self.find)
        self.open_btn.clicked.connect(self.open_head_view)
        self.table.cellDoubleClicked.connect(lambda row, _col: self.jump(row))
        for box in (self.query, self.target, self.rival):
            box.currentIndexChanged.connect(self._picks_changed)
        state.attention_ready.connect(self._result_arrived)
        state.model_loading.connect(lambda *_: self._clear_ranking("Loading the model…"))
        self._result_arrived(state.result)

    # ------------------------------------------------------------------ the pickers
    def _result_arrived(self, r=None) -> None:
        r = self.state.result if r is None else r
        if r is None or r.grid is not None:
            self.tokens, self.words = [], []
            self._fill_pickers()
            self._clear_ranking("" if r is None else "This lesson needs a text model: load minilm.")
            self.find_btn.setEnabled(False)
            return
        self.find_btn.setEnabled(True)
        if list(r.tokens) == self.tokens:
            # the same sentence: keep the learner's picks; the ranking stays only if it is this run's
            stale = self.ranking is not None and (self.ranking.model != r.model
                                                  or self._ranked_with != self.state.run_input())
            if stale:
                self._clear_ranking("")
            return
        self.tokens = list(r.tokens)
        self.words = self.calc.words_of(r.tokens, r.special)
        self._fill_pickers()
        self._clear_ranking("")

    def _fill_pickers(self) -> None:
        choices = [i for i, w in enumerate(self.words) if not w.special]
        defaults = [self.calc.find_word(self.words, t) for t in self.calc.PRIMER_WORDS]
        fallback = iter(c for c in choices if c not in defaults)
        for box, want in zip((self.query, self.target, self.rival), defaults):
            with signals_blocked(box):
                box.clear()
                for i in choices:
                    box.addItem(self.words[i].label, i)
                pick = want if want is not None else next(fallback, choices[0] if choices else None)
                if pick is not None:
                    box.setCurrentIndex(box.findData(pick))

    def picked(self) -> tuple[list[int], list[int], list[int]] | None:
        """Token indices of the query, target A and rival B words, or None when a picker is empty."""
        out = []
        for box in (self.query, self.target, self.rival):
            i = box.currentData()
            if i is None:
                return None
            out.append(list(self.words[i].indices))
        return out[0], out[1], out[2]

    def _picks_changed(self, *_) -> None:
        self._clear_ranking("")  # the table ranked other words

    # ------------------------------------------------------------------ ranking
    def find(self) -> None:
        picks = self.picked()
        if picks is None:
            self.message.setText("Type a sentence with at least three words first.")
            return
        q, a, b = picks
        if a == b:
            self.message.setText("The target A and the rival B must be different words.")
            return
        self._clear_ranking("Running the model and ranking its heads…")
        text, kw = self.state.run_input()
        self._ranked_with = (text, dict(kw))
        if not self.state.submit(L.find_heads, text, q, a, b, kw, key=LANE, on_result=self._ranked,
                                 on_error=self._failed):
            self._clear_ranking("No model is loaded yet.")

    def _failed(self, message: str) -> None:
        self._clear_ranking("")
        self.message.setText(message)

    def _ranked(self, ranking) -> None:
        if ranking.tokens != self.tokens:
            return  # the text changed while it ran
        self.ranking = ranking
        self.message.setText("")
        self._fill_table(ranking)
        best = ranking.best
        words = {k: " ".join(html.escape(ranking.tokens[i]) for i in idx)
                 for k, idx in (("q", ranking.query), ("a", ranking.a), ("b", ranking.b))}
        untrained = "" if ranking.trained else " <b>This model is untrained</b>: its heads link words by chance."
        if "b" in ranking.hidden:
            compared = (f"From “{words['q']}” it gives {best.to_a:.2f} of its weight to “{words['a']}”. "
                        f"<b>“{words['b']}” comes after “{words['q']}”</b>, and in this decoder a token sees only "
                        f"the tokens before it, so no head can give “{words['b']}” any weight: the heads are "
                        f"ranked by the weight to “{words['a']}” alone. Pick a rival before “{words['q']}” to "
                        "compare the two. ")
        else:
            compared = (f"From “{words['q']}” it gives {best.to_a:.2f} of its weight to “{words['a']}” and "
                        f"{best.to_b:.2f} to “{words['b']}” (A − B = {best.score:+.2f}). ")
        self.status.setText(
            f"<b>{html.escape(ranking.model)}</b>: best head <b>layer {best.layer}, head {best.head}</b>. "
            + compared + f"It is now selected, with “{words['q']}” as the "
            f"query; double-click a row to show another head. Every other token gives “{words['a']}” "
            f"{best.others_to_a:.2f} on average in this head"
            + _compared(best.others_to_a, best.to_a) + untrained)
        self.jump(0)

    def _fill_table(self, ranking) -> None:
        self.table.setRowCount(len(ranking.heads))
        for row, h in enumerate(ranking.heads):
            cells = [str(row + 1), str(h.layer), str(h.head), f"{h.score:+.3f}", f"{h.to_a:.3f}", f"{h.to_b:.3f}",
                     f"{h.others_to_a:.3f}"]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(row, col, item)

    def _clear_ranking(self, status: str) -> None:
        self.state.cancel(LANE)  # whatever is still running answers for something else
        self.ranking = None
        self.table.setRowCount(0)
        self.status.setText(status)
        self.message.setText("")
        self.open_btn.setEnabled(False)

    def jump(self, row: int) -> None:
        """Select the head in `row` of the ranking for the whole window, with the query word as the query."""
        if self.ranking is None or not 0 <= row < len(self.ranking.heads):
            return
        h = self.ranking.heads[row]
        self.state.select(h.layer, h.head)
        self.state.set_query(self.ranking.query[0])
        self.table.selectRow(row)
        self.open_btn.setEnabled(True)

    def open_head_view(self) -> None:
        window = self.window()
        if hasattr(window, "show_page"):
            window.show_page("head")

    def cell_texts(self) -> list[list[str]]:
        return [[self.table.item(i, j).text() for j in range(self.table.columnCount())]
                for i in range(self.table.rowCount())]
