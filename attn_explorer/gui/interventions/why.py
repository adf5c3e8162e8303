"""The why-this-head page: one cell (query i, key j) of one head, its logit split by who wrote the two streams.

Rows are the writers into the query's residual stream (the embeddings, each earlier head, each MLP, the biases),
columns the writers into the key's; cell (a, b) is scale · q_i[a] · k_j[b], and the whole matrix sums to the
logit the head softmaxes. Only the writers that matter most are listed, the rest folded into "all others" so
the sum still holds. Clicking a writer's row or column heading opens that head's map. The numbers come from one
worker job (`session.lens.why_job`); the layer, head and query follow the window's selection.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtWidgets import QComboBox, QLabel, QScrollArea, QSpinBox, QWidget

from attn_explorer.gui.interventions.tool import ToolPage, visible
from attn_explorer.gui.widgets.tables import NumberTable
from attn_explorer.session.lens import WHY_CONVENTION, why_job
from attn_explorer.session.state import SessionState

SHOWN = 10  # writers listed before "all others"


class WhyPage(ToolPage):
    WHAT = "Why a head looks there"
    AGAIN = "Change the layer, head, query or key to measure again."

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        self.table = NumberTable(digits=3, signed=True)
        self.table.plain_rows = 1  # the last row: each column's sum (a key writer's whole part)
        self.scroll = QScrollArea()
        self.scroll.setWidget(self.table)
        self.scroll.setWidgetResizable(False)
        super().__init__(state, self.scroll, parent)
        self.layer_spin, self.head_spin = QSpinBox(), QSpinBox()
        self.query_box, self.key_box = QComboBox(), QComboBox()
        for box, chars in ((self.query_box, 9), (self.key_box, 14)):  # "10: gave (α 0.60)" shows whole
            box.setMinimumContentsLength(chars)
            box.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.shown_spin = QSpinBox()
        self.shown_spin.setRange(3, 40)
        self.shown_spin.setValue(SHOWN)
        self.shown_spin.setToolTip("How many writers to list; the rest are summed into 'all others'")
        for w in (QLabel("Layer"), self.layer_spin, QLabel("Head"), self.head_spin, QLabel("Query"), self.query_box,
                  QLabel("Key"), self.key_box, QLabel("Show"), self.shown_spin):
            self.control_row.addWidget(w)
        self.finish_bar()
        self.why = None  # the WhyMatrix on screen
        self.boxes_for = None  # the RunResult the query and key lists were made from
        self.shown: tuple[list, list] = ([], [])  # (writer names, their (layer, head) or None), as listed
        self.shown_spin.valueChanged.connect(lambda *_: self._draw())
        # every change of the cell asks again at once (newest wins in the lane)
        self.query_box.currentIndexChanged.connect(self._query_picked)
        self.key_box.currentIndexChanged.connect(lambda *_: self._cell_changed())
        self.layer_spin.valueChanged.connect(lambda *_: self._query_picked())
        self.head_spin.valueChanged.connect(lambda *_: self._query_picked())
        self.table.cellClicked.connect(self._cell_clicked)
        self.table.verticalHeader().sectionClicked.connect(lambda i: self.open_writer(i))
        self.table.horizontalHeader().sectionClicked.connect(lambda j: self.open_writer(j))
        state.selection_changed.connect(lambda *_: self._follow_selection())
        state.query_changed.connect(lambda *_: self._follow_selection())

    # --------------------------------------------------------------------------- the cell asked about
    def _fill_boxes(self, r) -> None:
        """Spin ranges and token lists for result r, set to the window's layer, head and query."""
        info = self.state.info
        for spin, n, v in ((self.layer_spin, info.num_layers, self.state.layer),
                           (self.head_spin, info.num_heads, self.state.head)):
            spin.blockSignals(True)
            spin.setRange(0, n - 1)
            spin.setValue(min(v, n - 1))
            spin.blockSignals(False)
        self.boxes_for = r
        labels = [f"{j}: {visible(t, 14)}" for j, t in enumerate(r.tokens)]
        self.query_box.blockSignals(True)
        self.query_box.clear()
        self.query_box.addItems(labels)
        # the window's query; the first token has only itself to look at, so then the last one
        q = self.state.query if 0 < self.state.query < len(labels) else len(labels) - 1
        self.query_box.setCurrentIndex(q)
        self.query_box.blockSignals(False)
        self._fill_keys(r)

    def _fill_keys(self, r) -> None:
        """Keys up to the query; the one this head weighs most is picked."""
        q = max(0, self.query_box.currentIndex())
        row = self._weights(r, self.layer_spin.value(), self.head_spin.value(), q)
        self.key_box.blockSignals(True)
        self.key_box.clear()
        if row is None:  # a long input's maps live in a store that only a worker may read: no weights listed
            self.key_box.addItems([f"{j}: {visible(t, 12)}" for j, t in enumerate(r.tokens[: q + 1])])
            self.key_box.setCurrentIndex(q)
        else:
            self.key_box.addItems([f"{j}: {visible(t, 12)} (α {row[j]:.2f})" for j, t in enumerate(r.tokens[: q + 1])])
            self.key_box.setCurrentIndex(int(np.argmax(row)))
        self.key_box.blockSignals(False)

    @staticmethod
    def _weights(r, layer: int, head: int, q: int):
        """The head's weights of query q over keys 0..q from a dense result, or None for a lazy one."""
        if getattr(r, "is_lazy", False) or r.attentions is None:
            return None
        return r.attentions[layer, head, q, : q + 1]

    def _query_picked(self, *_) -> None:
        """A new query, layer or head: the keys (and the key picked) follow, then the cell is measured."""
        if self.boxes_for is not None and self.boxes_for is self.state.result:
            self._fill_keys(self.boxes_for)
            self.measure()

    def _cell_changed(self) -> None:
        if self.boxes_for is not None and self.boxes_for is self.state.result:
            self.measure()

    def _follow_selection(self) -> None:
        """The window's layer, head or query changed: ask again about the new cell (when shown)."""
        self.done_for = None
        if self.isVisible():
            self.refresh()
        else:
            self._stale = True

    # --------------------------------------------------------------------------- measuring
    def refresh(self) -> None:
        r = self.usable()
        if r is None or r is self.done_for:
            return
        self._fill_boxes(r)
        self.measure()

    def measure(self) -> None:
        r = self.usable()
        if r is None:
            return
        if self.boxes_for is not r:
            self._fill_boxes(r)
        self.done_for = r
        self.why = None
        self.readout.setText("")
        self.caption.setText("")
        self.stack.show_message("Splitting the logit by writer…")
        x, kw = self.state.run_input()
        args = (self.layer_spin.value(), self.head_spin.value(), max(0, self.query_box.currentIndex()),
                max(0, self.key_box.currentIndex()))
        self.start(why_job, x, kw, *args, key="lens-why", on_result=lambda w: self._ready(r, w),
                   message="Why this head")

    def _ready(self, r, why) -> None:
        if r is not self.state.result:
            return
        self.why = why
        self.stack.show_canvas()
        self._draw()

    def _draw(self) -> None:
        w = self.why
        if w is None:
            return
        names, heads, m = w.condensed(self.shown_spin.value())
        self.shown = (names, heads)
        rows = [f"{n}  ({m[i].sum():+.2f})" for i, n in enumerate(names)] + ["column sums"]
        self.table.set_matrix(np.vstack([m, m.sum(0, keepdims=True)]), rows, names)
        self.scroll.widget().adjustSize()
        row = None if self.done_for is None else self._weights(self.done_for, w.layer, w.head, w.query)
        alpha = "" if row is None else f" (α = {float(row[w.key]):.3f})"
        q, k = visible(w.tokens[w.query], 16), visible(w.tokens[w.key], 16)
        notes = (" " + " ".join(w.notes)) if w.notes else ""
        self.caption.setText(
            f"<b>Why does L{w.layer} H{w.head} look from {q!r} (query {w.query}) to {k!r} (key {w.key})?</b> Its logit "
            f"<b>{w.logit:.3f}</b>{alpha} split by who wrote the query's stream (rows, each with its sum) "
            f"and the key's (columns). <i>{WHY_CONVENTION}</i>{notes} Click a writer's heading to open that head.")
        self.readout.setText(f"The matrix sums to <b>{w.total:.4f}</b>; the head's own q·k·scale is "
                             f"<b>{w.logit:.4f}</b>. {len(w.writers)} writers in all.")

    # --------------------------------------------------------------------------- clicks
    def _cell_clicked(self, i: int, j: int) -> None:
        names, _ = self.shown
        if self.why is None or i >= len(names) or j >= len(names):
            return
        v = self.table.values[i, j]
        self.readout.setText(f"{names[i]} (into the query's stream) · {names[j]} (into the key's stream): {v:+.4f} of "
                             f"the logit {self.why.logit:.3f}.")

    def open_writer(self, i: int) -> None:
        """Open writer i's head (a head's row or column heading); other writers say what they are."""
        names, heads = self.shown
        if i >= len(names):
            return
        if heads[i] is not None:
            self.open_head(*heads[i])
        else:
            self.readout.setText(f"{names[i]}: not a head (no attention map to open).")
