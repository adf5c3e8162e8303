"""Lesson page "projections": X times W_Q, W_K, W_V gives Q, K, V; then the pattern and the output.

Numbers from `lessons.projections` (our core's MultiHeadAttention with one head), computed in a worker
(lane "lesson-projections"). Bad cells give one line on the page; the last good numbers stay.
"""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from attn_explorer.gui.widgets.tables import MatrixBox, NumberTable, WrapRow, explanation, scrolling_page
from attn_explorer.gui.lessons.words_page import WordsPage
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

INTRO = (
    "<b>Q, K and V are three roles.</b> Each token starts as one vector x (here 4 numbers, one row of X). "
    "Three learned matrices turn it into three vectors: a query Q = X W<sub>Q</sub> (what it looks for), a "
    "key K = X W<sub>K</sub> (what it offers to be found by) and a value V = X W<sub>V</sub> (what it passes "
    "on). A row times a 4×4 matrix is again 4 numbers. Then attention runs as before: the pattern "
    "softmax(Q Kᵀ / √d_k) has one row per token, and its rows average the values. The output has one row "
    "per token and 4 numbers per row: the same shape as X, so the next layer can take it.<br>"
    "These matrices are random (seeded), as before training. Edit X, type other words, or re-roll."
)


class ProjectionsLesson(WordsPage):
    LANE = "lesson-projections"

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(state, parent)  # self.result: the last good Projected
        lay = scrolling_page(self)
        lay.addWidget(explanation(INTRO))

        row = QHBoxLayout()
        self.words.setToolTip("Each word gets a fixed random vector (the same word, the same vector)")
        row.addWidget(QLabel("Words:"))
        row.addWidget(self.words, 1)
        row.addWidget(self.seed)
        row.addWidget(self.reroll)
        lay.addLayout(row)
        lay.addWidget(self.message)

        self.w_tables = {k: NumberTable() for k in ("q", "k", "v")}
        self.qkv_tables = {k: NumberTable() for k in ("q", "k", "v")}
        self.pattern = NumberTable(digits=3, signed=False)
        self.output = NumberTable()
        self.w_boxes = {k: MatrixBox(f"W<sub>{k.upper()}</sub> (4×4)", t) for k, t in self.w_tables.items()}
        self.qkv_boxes = {k: MatrixBox(k.upper(), t) for k, t in self.qkv_tables.items()}
        self.pattern_box = MatrixBox("pattern", self.pattern)
        self.output_box = MatrixBox("output", self.output)
        self.rows = []
        for title, boxes in (("Input and weights", [self.x_box, *self.w_boxes.values()]),
                             ("Queries, keys, values", list(self.qkv_boxes.values())),
                             ("Attention", [self.pattern_box, self.output_box])):
            lay.addWidget(QLabel(f"<b>{title}</b>"))
            wrap = WrapRow()
            for b in boxes:
                wrap.add(b)
            self.rows.append(wrap)
            lay.addWidget(wrap)
        self.shapes = QLabel("")
        self.shapes.setWordWrap(True)
        lay.addWidget(self.shapes)
        lay.addStretch(1)

        self.start()

    def job(self) -> tuple:
        return (L.project,)

    def _show(self, p, w) -> None:
        toks = self.tokens()
        n, d = p.x.shape
        dims = [str(j + 1) for j in range(d)]
        self.x_box.title.setText(f"<b>X</b> ({n}×{d}: one row per token)")
        for key, m in (("q", w.w_q), ("k", w.w_k), ("v", w.w_v)):
            self.w_tables[key].set_matrix(m, dims, dims)
            self.w_boxes[key].title.setText(f"W<sub>{key.upper()}</sub> ({d}×{d}, seed {w.seed})")
        for key, m in (("q", p.q), ("k", p.k), ("v", p.v)):
            self.qkv_tables[key].set_matrix(m, toks, dims)
            self.qkv_boxes[key].title.setText(
                f"<b>{key.upper()}</b> = X W<sub>{key.upper()}</sub>: ({n}×{d})·({d}×{d}) = {n}×{m.shape[1]}")
        self.pattern.set_matrix(p.pattern, toks, toks)
        self.pattern_box.title.setText(f"<b>pattern</b> = softmax(Q Kᵀ / √{p.q.shape[1]}): {n}×{n}, rows sum to 1")
        self.output.set_matrix(p.output, toks, dims)
        self.output_box.title.setText(f"<b>output</b> = pattern · V: ({n}×{n})·({n}×{d}) = {n}×{p.output.shape[1]}")
        same = p.output.shape == p.x.shape
        self.shapes.setText(f"X is {n}×{d}; the output is {p.output.shape[0]}×{p.output.shape[1]}: "
                            + ("the same shape, as promised." if same else "a different shape."))
        for wrap in self.rows:
            wrap.refit()
