"""Lesson page "inside-a-head": the loaded model's own numbers for one head and one query token.

The page follows the explorer's selection (layer, head, query token) and its d_k slider. Each change
runs `api.probe.head_trace` in a worker (`state.submit`, lane "lesson-inside-a-head", newest wins): one forward pass whose captured q,
k and values, and whose own attention row, are what the page shows. While a new trace is on its way
the old numbers are greyed out and the header says so; a failed trace says why in one line.
"""
from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHBoxLayout, QHeaderView, QLabel, QSpinBox,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)
from superqt.utils import signals_blocked

from attn_explorer.gui.widgets.tables import (explanation, message_label, number_text, scrolling_page,
                                                     shade)
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

INTRO = (
    "<b>Inside a real head.</b> This is the loaded model at work on your text, not a toy. In one layer, one "
    "head turns every token into a query q, a key k and a value v (each a list of d_k numbers). For the "
    "query token you pick, the head scores every key with the dot product q·k, multiplies the scores by "
    "scale = 1/√d_k (times the d_k slider on the left), takes exp and divides by the sum: those are the "
    "weights. The head's output is the values averaged with these weights. Every number below comes from "
    "one forward pass of the model. Double-click a token in <i>One head</i> or <i>Tokens</i> to open it here."
)
LANE = "lesson-inside-a-head"
COLUMNS = ["token", "q·k", "× scale", "exp(s − max)", "weight"]


class InsideAHeadLesson(QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.lanes = (LANE,)
        self.calc = L.inside_a_head
        self.trace = None  # the api.probe.HeadTrace on screen
        self._pending = False  # something changed while the page was hidden
        lay = scrolling_page(self)
        lay.addWidget(explanation(INTRO))

        pick = QHBoxLayout()
        self.layer_spin, self.head_spin = QSpinBox(), QSpinBox()
        self.layer_spin.setPrefix("layer ")
        self.head_spin.setPrefix("head ")
        self.query_combo = QComboBox()
        self.query_combo.setMinimumContentsLength(8)
        self.query_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        pick.addWidget(self.layer_spin)
        pick.addWidget(self.head_spin)
        pick.addWidget(QLabel("query:"))
        pick.addWidget(self.query_combo)
        pick.addStretch(1)
        lay.addLayout(pick)

        self.header = QLabel("Waiting for the model…")
        self.header.setWordWrap(True)
        self.header.setTextFormat(Qt.RichText)
        self.message = message_label()
        self.q_line = QLabel("")
        self.q_line.setWordWrap(True)
        self.q_line.setTextFormat(Qt.RichText)
        self.q_line.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.verticalHeader().setToolTip("token index")
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.kv_line = QLabel("")
        self.kv_line.setWordWrap(True)
        self.kv_line.setTextFormat(Qt.RichText)
        self.kv_line.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.out_line = QLabel("")
        self.out_line.setWordWrap(True)
        self.out_line.setTextFormat(Qt.RichText)
        self.out_line.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.body = QWidget()  # greyed out while a new trace is computed
        body = QVBoxLayout(self.body)
        body.setContentsMargins(0, 0, 0, 0)
        for w in (self.q_line, self.table, self.kv_line, self.out_line):
            body.addWidget(w)
        for w in (self.header, self.message, self.body):
            lay.addWidget(w)
        lay.addStretch(1)

        self.layer_spin.valueChanged.connect(lambda v: state.select(layer=v))
        self.head_spin.valueChanged.connect(lambda v: state.select(head=v))
        self.query_combo.currentIndexChanged.connect(lambda i: state.set_query(i) if i >= 0 else None)
        self.table.currentCellChanged.connect(lambda row, *_: self._show_key(row))
        state.attention_ready.connect(self._changed)
        state.selection_changed.connect(self._changed)
        state.query_changed.connect(self._changed)
        state.model_loading.connect(lambda *_: self._mark_stale("Loading a model…"))
        self._changed()

    # ----------------------------------------------------------------------------- asking
    def _changed(self, *_) -> None:
        self._sync_pickers()
        if self.state.result is None or self.state.info is None:
            return
        self._mark_stale("Updating…")
        self.message.setText("")  # a failed trace was about the previous selection or input: the new one may work
        if not self.isVisible():
            self._pending = True  # traced when shown: a hidden page runs no model
            return
        self._request()

    def showEvent(self, ev):  # noqa: N802
        super().showEvent(ev)
        if self._pending or (self.trace is None and self.state.result is not None):
            self._pending = False
            self._request()

    def _asking(self) -> tuple:
        s = self.state
        x, kw = s.run_input()
        return (s.layer, s.head, s.query, x, tuple(sorted(kw.items(), key=str)))

    def _request(self) -> None:
        s = self.state
        x, kw = s.run_input()
        asked = self._asking()
        s.submit(L.head_trace, x, s.layer, s.head, s.query, kw, key=LANE,
                 on_result=lambda t: self._arrived(t, asked), on_error=self._failed)

    def _arrived(self, trace, asked: tuple) -> None:
        if asked != self._asking():
            return  # the selection moved on meanwhile: its own trace is on the way
        self.trace = trace
        self.message.setText("")
        self._show(trace)

    def _failed(self, message: str) -> None:
        self.message.setText(message)
        self.header.setText("No numbers: the trace failed (the red line below says why).")
        self.body.setEnabled(False)

    def _mark_stale(self, why: str) -> None:
        self.body.setEnabled(False)  # greyed: these numbers describe the previous selection
        self.header.setText(why)

    def _sync_pickers(self) -> None:
        s, info, r = self.state, self.state.info, self.state.result
        for spin, top, val in ((self.layer_spin, info.num_layers if info else 1, s.layer),
                               (self.head_spin, info.num_heads if info else 1, s.head)):
            with signals_blocked(spin):
                spin.setRange(0, top - 1)
                spin.setValue(val)
        tokens = [f"{i}: {t}" for i, t in enumerate(r.tokens)] if r is not None else []
        with signals_blocked(self.query_combo):
            if [self.query_combo.itemText(i) for i in range(self.query_combo.count())] != tokens:
                self.query_combo.clear()
                self.query_combo.addItems(tokens)
            if tokens:
                self.query_combo.setCurrentIndex(min(s.query, len(tokens) - 1))

    # ----------------------------------------------------------------------------- showing
    def _show(self, t) -> None:
        info = self.state.info
        tab = self.calc.trace_table(t)
        untrained = "" if t.trained else " <b>(untrained model: random weights)</b>"
        name = html.escape(info.name) if info is not None else "the model"
        self.header.setText(
            f"<b>{name}</b>{untrained}, layer {t.layer}, head {t.head}, query "
            f"<b>\"{html.escape(t.tokens[t.query])}\"</b> (token {t.query}). d_k = {t.d_k}, "
            f"scale = {t.dk_scale:.2f} / √{t.d_k} = {t.scale:.4f}."
        )
        self.q_line.setText(f"<b>q</b> ({t.d_k} numbers) = {vector_text(t.q)}")
        rows = list(tab.rows)
        extra = (1 if tab.rest_count else 0) + (1 if tab.hidden_count else 0) + 1
        self.table.setRowCount(len(rows) + extra)
        peak = max((r.weight for r in rows), default=0.0)
        labels = []
        for i, r in enumerate(rows):
            self._put(i, [r.token, f"{r.logit:.3f}", f"{r.scaled:.3f}", f"{r.exp:.4f}", f"{r.weight:.4f}"])
            self.table.item(i, 4).setBackground(shade(r.weight, peak, False))
            labels.append(str(r.index))
        i = len(rows)
        if tab.rest_count:
            self._put(i, [f"{tab.rest_count} other keys", "", "", f"{tab.rest_exp:.4f}", f"{tab.rest_weight:.4f}"])
            labels.append("…")
            i += 1
        if tab.hidden_count:
            self._put(i, [f"{tab.hidden_count} later tokens", "hidden", "(causal)", "0", "0"])
            labels.append("—")
            i += 1
        self._put(i, ["sum", "", "", f"{tab.exp_sum:.4f}", f"{tab.weight_sum:.3f}"])
        labels.append("Σ")
        self.table.setVerticalHeaderLabels(labels)
        self.table.resizeColumnsToContents()
        frame = 2 * self.table.frameWidth()
        self.table.setFixedSize(self.table.verticalHeader().sizeHint().width() + self.table.horizontalHeader().length() + frame,
                                self.table.horizontalHeader().height() + self.table.verticalHeader().length() + frame)
        check = float(np.abs(t.probs - t.attention_row).max())
        self.out_line.setText(
            f"weight = exp / sum (max {tab.shift:.3f} subtracted first; the weights do not change). "
            f"These weights are the explorer's map for this head (largest difference {check:.1e}).<br>"
            f"<b>output</b> = Σ weight × v = {vector_text(t.output)}<br>"
            f"This is the head's output for \"{html.escape(t.tokens[t.query])}\" before W_O; W_O then mixes "
            f"the heads' outputs back into the token's {t.head_share.size} numbers."
        )
        self.body.setEnabled(True)
        self.table.clearSelection()
        self._show_key(0)  # the top key until the learner clicks another row

    def _put(self, row: int, texts: list[str]) -> None:
        for col, text in enumerate(texts):
            item = QTableWidgetItem(text)
            item.setTextAlignment((Qt.AlignLeft if col == 0 else Qt.AlignRight) | Qt.AlignVCenter)
            self.table.setItem(row, col, item)

    def _show_key(self, row: int) -> None:
        t = self.trace
        label = self.table.verticalHeaderItem(row) if row >= 0 else None
        if t is None or label is None or not label.text().isdigit():
            self.kv_line.setText("Click a row to see that token's key and value.")
            return
        j = int(label.text())
        self.kv_line.setText(
            f"<b>k</b> of \"{html.escape(t.tokens[j])}\" = {vector_text(t.k[j])}<br>"
            f"q·k = Σ q_i × k_i = {t.logits[j]:.3f}<br>"
            f"<b>v</b> of \"{html.escape(t.tokens[j])}\" = {vector_text(t.v[j])}<br>"
            "<i>(click a row of the table for another key)</i>"
        )


def vector_text(v) -> str:
    """All the numbers, two decimals, in a monospace run that wraps."""
    nums = " ".join(number_text(x, 2) for x in np.asarray(v).ravel())
    return f'<span style="font-family: monospace;">[{nums}]</span>'

