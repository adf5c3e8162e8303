"""Lesson page "by-hand": type a query, keys and values; every step of attention appears as numbers.

The numbers come from `lessons.by_hand` (our core's scaled_dot_product_attention), computed in a
worker (`state.submit`, lane "lesson-by-hand": the newest edit wins). A cell that is not a number
gives one line on the page and leaves the last good numbers in place.
"""
from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (QCheckBox, QDoubleSpinBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton,
                               QSpinBox, QWidget)

from superqt.utils import signals_blocked

from attn_explorer.gui.widgets.tables import (KEPT_NOTE, EditableTable, MatrixBox, NumberTable, WrapRow,
                                                     explanation, message_label, scrolling_page)
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

INTRO = (
    "<b>Attention is a weighted average.</b> A <i>query</i> q asks a question. Each token offers a "
    "<i>key</i> k (what it is about) and a <i>value</i> v (what it passes on). The score of a key is the "
    "dot product q·k: multiply matching numbers and add them up. Scores are divided by √d_k, where "
    "d_k is how many numbers a key has, so they do not grow with longer vectors. Then <i>softmax</i> "
    "turns them into weights: take exp of each, divide by their sum. The weights are positive and add "
    "up to 1. The output is the values averaged with these weights.<br>"
    "The primer's exercise: q = [2, 0], keys [2, 0], [0, 3], [1, 1]. Change any number and watch every step."
)
STEP_COLUMNS = ["q·k", "× scale", "exp", "weight"]
LANE = "lesson-by-hand"
MAX_KEYS, MAX_DIM = 12, 8


class ByHandLesson(QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.calc = L.by_hand
        self.lanes = (LANE,)
        self.steps = None  # the last good HandSteps
        lay = scrolling_page(self)
        lay.addWidget(explanation(INTRO))

        self.query = EditableTable()
        self.keys = EditableTable()
        self.values = EditableTable()
        inputs = WrapRow()
        self.inputs = inputs
        inputs.add(MatrixBox("<b>query q</b> (1 row)", self.query))
        inputs.add(MatrixBox("<b>keys K</b> (one row per token)", self.keys))
        inputs.add(MatrixBox("<b>values V</b> (one row per token)", self.values))
        lay.addWidget(inputs)

        knobs = QHBoxLayout()
        self.add_btn = QPushButton("Add a token")
        self.remove_btn = QPushButton("Remove last token")
        self.d_k = QSpinBox()
        self.d_k.setRange(1, MAX_DIM)
        self.d_k.setPrefix("d_k = ")
        self.d_k.setToolTip("How many numbers the query and each key have")
        self.d_v = QSpinBox()
        self.d_v.setRange(1, MAX_DIM)
        self.d_v.setPrefix("d_v = ")
        self.d_v.setToolTip("How many numbers each value has")
        for w in (self.add_btn, self.remove_btn, self.d_k, self.d_v):
            knobs.addWidget(w)
        knobs.addStretch(1)
        lay.addLayout(knobs)
        temp = QHBoxLayout()
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.05, 20.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setDecimals(2)
        self.temperature.setValue(1.0)
        self.temperature.setToolTip("Multiplies 1/√d_k, like the explorer's d_k slider: above 1 the weights get "
                                    "sharper, below 1 flatter")
        temp.addWidget(QLabel("Multiplier on 1/√d_k:"))
        temp.addWidget(self.temperature)
        temp.addStretch(1)
        lay.addLayout(temp)

        self.message = message_label()
        lay.addWidget(self.message)
        self.scale_line = QLabel("")
        self.scale_line.setWordWrap(True)
        lay.addWidget(self.scale_line)
        self.step_table = NumberTable(digits=3, signed=True, per_column=True)
        self.step_table.plain_rows = 1  # the sums
        self.out_table = NumberTable(digits=3)
        results = WrapRow()
        self.results = results
        results.add(MatrixBox("<b>Step by step</b>, one row per key", self.step_table))
        results.add(MatrixBox("<b>output</b> = Σ weight × value", self.out_table))
        lay.addWidget(results)
        self.sum_line = QLabel("")
        self.sum_line.setWordWrap(True)
        self.sum_line.setTextFormat(Qt.RichText)
        lay.addWidget(self.sum_line)

        self.show_code = QCheckBox("Show the PyTorch")
        self.show_code.setToolTip("Our core's own code, which computed the weights and the output above")
        self.code = QPlainTextEdit()
        self.code.setReadOnly(True)
        self.code.setFont(QFont("monospace"))
        self.code.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.code.setMinimumHeight(260)
        self.code.hide()
        lay.addWidget(self.show_code)
        lay.addWidget(self.code)
        lay.addStretch(1)

        self.query.set_matrix(self.calc.DEFAULT_QUERY, ["q"], None)
        self.keys.set_matrix(self.calc.DEFAULT_KEYS, self._labels("k", 3))
        self.values.set_matrix(self.calc.DEFAULT_VALUES, self._labels("v", 3))
        self.d_k.setValue(2)
        self.d_v.setValue(2)
        for t in (self.query, self.keys, self.values):
            t.edited.connect(self.recompute)
        self.temperature.valueChanged.connect(self.recompute)
        self.add_btn.clicked.connect(self.add_token)
        self.remove_btn.clicked.connect(self.remove_token)
        self.d_k.valueChanged.connect(lambda n: self._resize_columns((self.query, self.keys), n))
        self.d_v.valueChanged.connect(lambda n: self._resize_columns((self.values,), n))
        self.show_code.toggled.connect(self._toggle_code)
        self.recompute()

    @staticmethod
    def _labels(prefix: str, n: int) -> list[str]:
        return [f"{prefix}{i + 1}" for i in range(n)]

    def recompute(self, *_) -> None:
        """Read every table and compute in a worker; on bad input one line, and the last good numbers stay."""
        self.state.submit(L.hand_steps, self.query.texts(), self.keys.texts(), self.values.texts(),
                          self.temperature.value(), key=LANE, uses_model=False, on_result=self._computed,
                          on_error=self._refused)

    def _computed(self, answer) -> None:
        steps, values = answer
        self.message.setText("")
        self.steps = steps
        self._show(steps, values)

    def _refused(self, message: str) -> None:
        self.message.setText(message + KEPT_NOTE)

    def _show(self, s, values: np.ndarray) -> None:
        M = len(s.scores)
        nan = np.full(2, np.nan)
        table = np.column_stack([s.scores, s.scaled, s.exps, s.weights])
        table = np.vstack([table, [*nan, s.total, s.weights.sum()]])  # the sums
        self.step_table.set_matrix(table, self._labels("k", M) + ["sum"], STEP_COLUMNS)
        self.out_table.set_matrix(s.output[None], ["output"], [str(j + 1) for j in range(len(s.output))])
        self.scale_line.setText(
            f"scale = {s.temperature:g} / √{s.d_k} = {s.scale:.3f}.  "
            + (f"The scaled scores are large, so the largest, {s.shift:.3f}, is subtracted before exp "
               "(this leaves the weights unchanged)." if s.shift else "")
        )
        terms = " + ".join(f"{w:.3f}×[{', '.join(f'{x:g}' for x in row)}]" for w, row in zip(s.weights, values))
        out = ", ".join(f"{x:.3f}" for x in s.output)
        self.sum_line.setText(
            f"weights = exp / sum; they add up to <b>{s.weights.sum():.3f}</b>.<br>"
            f"output = {html.escape(terms)} = <b>[{out}]</b> ({len(s.output)} numbers, like each value)."
        )
        self.results.refit()

    def add_token(self) -> None:
        if self.keys.rowCount() >= MAX_KEYS:
            self.message.setText(f"at most {MAX_KEYS} tokens on this page")
            return
        for table, prefix in ((self.keys, "k"), (self.values, "v")):
            rows = table.texts() + [["0"] * table.columnCount()]
            table.set_matrix(self._safe(rows), self._labels(prefix, len(rows)))
            self._restore_texts(table, rows)
        self.inputs.refit()
        self.recompute()

    def remove_token(self) -> None:
        if self.keys.rowCount() <= 1:
            self.message.setText("keep at least one token")
            return
        for table, prefix in ((self.keys, "k"), (self.values, "v")):
            rows = table.texts()[:-1]
            table.set_matrix(self._safe(rows), self._labels(prefix, len(rows)))
            self._restore_texts(table, rows)
        self.inputs.refit()
        self.recompute()

    def _resize_columns(self, tables, n: int) -> None:
        for table in tables:
            rows = [(r + ["0"] * n)[:n] for r in table.texts()]
            labels = table.row_labels()
            table.set_matrix(self._safe(rows), labels)
            self._restore_texts(table, rows)
        self.inputs.refit()
        self.recompute()

    @staticmethod
    def _safe(rows: list[list[str]]) -> np.ndarray:
        """The cells as numbers for laying out the table (non-numbers as 0; their text is put back after)."""
        def num(t: str) -> float:
            try:
                return float(t)
            except ValueError:
                return 0.0
        return np.array([[num(t) for t in r] for r in rows], dtype=np.float64).reshape(len(rows), -1)

    @staticmethod
    def _restore_texts(table: EditableTable, rows: list[list[str]]) -> None:
        with signals_blocked(table):
            for i, r in enumerate(rows):
                for j, t in enumerate(r):
                    table.item(i, j).setText(t)
        table.fit()

    def _toggle_code(self, on: bool) -> None:
        if on and not self.code.toPlainText():
            self.code.setPlainText(self.calc.core_source())
        self.code.setVisible(on)
