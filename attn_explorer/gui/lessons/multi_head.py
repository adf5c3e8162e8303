"""Lesson page "multi-head": split the 4 numbers over h heads, one pattern each, then Concat and W_O.

Numbers from `lessons.multi_head` (our core's MultiHeadAttention(dim=4, num_heads=h)), computed in a
worker (lane "lesson-multi-head"). Bad cells give one line on the page; the last good numbers stay.
"""
from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QWidget

from attn_explorer.gui.widgets.tables import MatrixBox, NumberTable, WrapRow, explanation, scrolling_page
from attn_explorer.gui.lessons.words_page import DIMS, WordsPage
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

INTRO = (
    "<b>Several heads look in different ways.</b> Multi-head attention cuts Q, K and V into h slices. "
    "With 4 numbers and h = 2, head 1 gets numbers 1–2 and head 2 gets numbers 3–4 (d_k = 4 / h each). "
    "Each head computes its own pattern from its own slice, so one head can follow one kind of link and "
    "another head a different one. Their outputs are laid side by side (Concat: 4 numbers again) and "
    "multiplied by one more matrix, W<sub>O</sub>, which mixes what the heads found.<br>"
    "Compare each head's pattern with the single head's (all 4 numbers at once). The matrices are random "
    "(seeded): the same W<sub>Q</sub>, W<sub>K</sub>, W<sub>V</sub> as lesson 3 at the same seed."
)


class MultiHeadLesson(WordsPage):
    LANE = "lesson-multi-head"

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(state, parent)  # self.result: the last good MultiHead
        self.calc = L.multi_head
        lay = scrolling_page(self)
        lay.addWidget(explanation(INTRO))

        row = QHBoxLayout()
        self.heads = QComboBox()
        self.heads.addItems([f"h = {h}" for h in self.calc.HEAD_CHOICES])
        self.heads.setCurrentIndex(1)
        row.addWidget(QLabel("Words:"))
        row.addWidget(self.words, 1)
        lay.addLayout(row)
        knobs = QHBoxLayout()
        knobs.addWidget(QLabel("Heads:"))
        knobs.addWidget(self.heads)
        knobs.addWidget(self.seed)
        knobs.addWidget(self.reroll)
        knobs.addStretch(1)
        lay.addLayout(knobs)
        lay.addWidget(self.message)

        lay.addWidget(QLabel("<b>Input</b> (edit any number)"))
        self.input_row = WrapRow()
        self.input_row.add(self.x_box)
        lay.addWidget(self.input_row)
        lay.addWidget(QLabel("<b>Patterns</b>: one per head, and the single head for comparison"))
        self.pattern_row = WrapRow()
        lay.addWidget(self.pattern_row)
        lay.addWidget(QLabel("<b>Heads' outputs → Concat → W<sub>O</sub></b>"))
        self.output_row = WrapRow()
        lay.addWidget(self.output_row)
        self.concat = NumberTable()
        self.w_o = NumberTable()
        self.output = NumberTable()
        self.concat_box = MatrixBox("Concat", self.concat)
        self.w_o_box = MatrixBox("W<sub>O</sub>", self.w_o)
        self.output_box = MatrixBox("output", self.output)
        self.pattern_tables: list[NumberTable] = []
        self.single = NumberTable(digits=3, signed=False)
        self.head_out_tables: list[NumberTable] = []
        self.shapes = QLabel("")
        self.shapes.setWordWrap(True)
        lay.addWidget(self.shapes)
        lay.addStretch(1)

        self.heads.currentIndexChanged.connect(self.recompute)
        self.start()

    @property
    def num_heads(self) -> int:
        return self.calc.HEAD_CHOICES[self.heads.currentIndex()]

    def job(self) -> tuple:
        return (L.split_heads, self.num_heads)

    def _show(self, mh, w) -> None:
        toks = self.tokens()
        n, h, d_k = len(toks), mh.num_heads, mh.d_k
        self.x_box.title.setText(f"<b>X</b> ({n}×4)")
        # the heads' tables are rebuilt when h changes (the rows take ownership of their boxes)
        if len(self.pattern_tables) != h:
            for row in (self.pattern_row, self.output_row):
                row.clear()
            self.single = NumberTable(digits=3, signed=False)
            self.pattern_tables = [NumberTable(digits=3, signed=False) for _ in range(h)]
            self.head_out_tables = [NumberTable() for _ in range(h)]
            for i, t in enumerate(self.pattern_tables):
                self.pattern_row.add(MatrixBox(f"head {i + 1}: numbers {i * d_k + 1}–{(i + 1) * d_k}", t))
            self.pattern_row.add(MatrixBox("single head (all 4 numbers)", self.single))
            for i, t in enumerate(self.head_out_tables):
                self.output_row.add(MatrixBox(f"head {i + 1} output ({n}×{d_k})", t))
            self.concat = NumberTable()
            self.w_o = NumberTable()
            self.output = NumberTable()
            self.concat_box = self.output_row.add(MatrixBox("Concat", self.concat))
            self.w_o_box = self.output_row.add(MatrixBox("W<sub>O</sub> (4×4)", self.w_o))
            self.output_box = self.output_row.add(MatrixBox("output", self.output))
        for i, t in enumerate(self.pattern_tables):
            t.set_matrix(mh.patterns[i], toks, toks)
            self.pattern_tables[i].parentWidget().title.setText(
                f"<b>head {i + 1}</b>: numbers {i * d_k + 1}–{(i + 1) * d_k}, d_k = {d_k}")
        self.single.set_matrix(mh.single_pattern, toks, toks)
        for i, t in enumerate(self.head_out_tables):
            t.set_matrix(mh.head_outputs[i], toks, [str(j + 1) for j in range(d_k)])
            t.parentWidget().title.setText(f"head {i + 1} output ({n}×{d_k})")
        cols = [f"h{i + 1}·{j + 1}" for i in range(h) for j in range(d_k)]
        self.concat.set_matrix(mh.concat, toks, cols)
        self.concat_box.title.setText(f"<b>Concat</b> ({n}×{h}·{d_k} = {n}×4)")
        self.w_o.set_matrix(mh.w_o, DIMS, DIMS)
        self.w_o_box.title.setText(f"W<sub>O</sub> (4×4, seed {w.seed})")
        self.output.set_matrix(mh.output, toks, DIMS)
        self.output_box.title.setText(f"<b>output</b> = Concat · W<sub>O</sub> ({n}×4)")
        self.shapes.setText(f"{h} head{'s' if h > 1 else ''} × {d_k} numbers = 4: Concat has the input's width, "
                            f"and W_O keeps it, so the output is {n}×4 like X.")
        for row in (self.input_row, self.pattern_row, self.output_row):
            row.refit()
