"""Lesson page "no-softmax": attention without a softmax (issue 25 C).

The primer's sentence through one softmax head and one Gated DeltaNet head of a tiny random model, on the same
q, k and v: the softmax's map (probabilities, the session's colour map, 0..1) beside the DeltaNet's implicit map
(signed: the diverging scale centred at 0 every view uses for recurrent layers); the decay (the last query's
|A| against distance, and the envelope decay^(t-s)); a cost table (why the recurrence is O(n) while its map is
n × n); a pointer to the Cost page's "linear" variant. Numbers from `lessons.no_softmax` (core's own attention
and delta-rule code), computed in a worker (lane "lesson-no-softmax").
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import (QAbstractItemView, QAbstractScrollArea, QBoxLayout, QCheckBox, QDoubleSpinBox,
                               QHBoxLayout, QHeaderView, QLineEdit, QSpinBox, QTableWidget, QTableWidgetItem, QWidget)

from attn_explorer.gui.widgets.diverging import diverging_colormap
from attn_explorer.gui.widgets.heatmap import colormap
from attn_explorer.gui.widgets.tables import explanation, message_label, scrolling_page
from attn_explorer.session import lessons as L
from attn_explorer.session.mixers import signed_levels
from attn_explorer.session.state import SessionState

LANE = "lesson-no-softmax"
INTRO = (
    "<b>Attention without a softmax.</b> Half the layers of 2026's hybrid models (Qwen3.5, Qwen3-Next: Gated "
    "DeltaNet; Granite 4, Falcon-H1: Mamba-2) have no softmax. They read the sentence token by token into a "
    "fixed-size state S: at each token S decays by g, the old value stored under k is partly erased (strength "
    "β) and v is written in its place; the output is S read with q. Unrolled, that is still "
    "<i>output<sub>t</sub> = Σ<sub>s</sub> A[t, s]·v<sub>s</sub></i>: an implicit attention map. Below, the same "
    "q, k and v go through both heads.<br><b>Untrained model (random, seeded weights)</b>: the patterns mean "
    "nothing; the mechanics are the real ones (core's own attention and delta-rule code).")
SIDE_BY_SIDE_PX = 760  # narrower: the two maps one above the other
COLUMNS = ["n", "softmax work", "softmax memory", "DeltaNet work", "DeltaNet memory", "map cells (n×n, lower half)"]


def _map_plot(title: str) -> tuple[pg.PlotWidget, pg.ImageItem, pg.ColorBarItem]:
    w = pg.PlotWidget(title=title)
    w.setMinimumSize(260, 300)
    p = w.getPlotItem()
    p.invertY(True)
    p.setAspectLocked(True)
    p.setMouseEnabled(False, False)
    p.hideButtons()
    p.setLabel("left", "query (row)")
    p.setLabel("bottom", "key (column)")
    img = pg.ImageItem(axisOrder="row-major")
    p.addItem(img)
    bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), interactive=False, width=12)
    bar.setImageItem(img, insert_in=p)
    bar.axis.enableAutoSIPrefix(False)
    return w, img, bar


def _number(v: float) -> str:
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= div:
            return f"{v / div:.3g} {unit}"
    return f"{v:.3g}"


class NoSoftmaxLesson(QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.lanes = (LANE,)
        self.result = None  # the Comparison on screen
        lay = scrolling_page(self)
        lay.addWidget(explanation(INTRO))
        knobs = QHBoxLayout()
        self.text = QLineEdit(L.no_softmax.PRIMER_SENTENCE)
        self.text.setToolTip("The sentence (words and punctuation are the tokens)")
        self.text.setCursorPosition(0)  # its start shows, not its end
        self.decay = QDoubleSpinBox()
        self.decay.setRange(0.05, 1.0)
        self.decay.setSingleStep(0.05)
        self.decay.setValue(0.9)
        self.decay.setPrefix("decay e^g: ")
        self.decay.setToolTip("How much of the state each token keeps (1: no decay, plain delta rule)")
        self.fixed_beta = QCheckBox("one β for all:")
        self.beta = QDoubleSpinBox()
        self.beta.setRange(0.05, 1.0)
        self.beta.setSingleStep(0.05)
        self.beta.setValue(1.0)
        self.beta.setEnabled(False)
        self.seed = QSpinBox()
        self.seed.setRange(0, 9999)
        self.seed.setPrefix("seed: ")
        knobs.addWidget(self.text, 1)
        for w in (self.decay, self.fixed_beta, self.beta, self.seed):
            knobs.addWidget(w)
        lay.addLayout(knobs)
        self.message = message_label()
        lay.addWidget(self.message)

        maps = self.maps = QBoxLayout(QBoxLayout.TopToBottom)
        self.soft_plot, self.soft_img, self.soft_bar = _map_plot("softmax head: probabilities")
        self.delta_plot, self.delta_img, self.delta_bar = _map_plot("Gated DeltaNet head: implicit A")
        self.delta_bar.setColorMap(diverging_colormap())
        self.delta_bar.axis.setLabel("implicit attention (Gated DeltaNet), signed")
        self.soft_bar.axis.setLabel("weight (rows sum to 1)")
        maps.addWidget(self.soft_plot)
        maps.addWidget(self.delta_plot)
        lay.addLayout(maps)
        self.maps_note = explanation("")
        lay.addWidget(self.maps_note)

        self.decay_plot = pg.PlotWidget(title="The decay: the last token's row of |A| against distance")
        self.decay_plot.setMinimumHeight(220)
        self.decay_plot.setMaximumHeight(300)
        dp = self.decay_plot.getPlotItem()
        dp.setLabel("bottom", "distance t − s (tokens back)")
        dp.setLabel("left", "|A[t, s]| ÷ |q_t|")
        dp.addLegend(offset=(-8, 8), labelTextSize="8pt")
        dp.setMouseEnabled(False, False)
        dp.hideButtons()
        lay.addWidget(self.decay_plot)
        self.decay_note = explanation("")
        lay.addWidget(self.decay_note)

        lay.addWidget(explanation(
            "<b>Why O(n), when the map is n × n.</b> Softmax must keep every earlier key and value (the KV cache "
            "grows with n) and compare each query with all of them: about 2·n²·d multiply-adds per head. The "
            "recurrence keeps only its d_k × d_v state: each token costs about 4·d² whatever came before, so the "
            "whole input costs O(n·d²) and the memory stays flat. The implicit map A is not computed to run the "
            "layer at all; it is what the state <i>amounts to</i>, and drawing it still takes n(n+1)/2 cells. "
            "That is why the explorer keeps only q, k, β and g per token and computes any tile of A on demand. "
            f"Per head, d = {L.no_softmax.COST_D}:"))
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.NoSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.setSizeAdjustPolicy(QAbstractScrollArea.AdjustToContents)
        lay.addWidget(self.table, 0, Qt.AlignLeft)
        self.bridge = explanation(
            "<b>The bridge: the Cost page's “linear” variant.</b> Open <i>Cost</i> and tick <b>linear</b>: "
            "φ(q)(φ(k)ᵀv) with φ = elu + 1, O(n·d²). That is linear attention: S<sub>t</sub> = S<sub>t−1</sub> + "
            "φ(k<sub>t</sub>) v<sub>t</sub>ᵀ, no decay, no erasing. Gated DeltaNet is the same recurrence with a "
            "decay g (old tokens fade) and the delta rule's β (write v where k points, after erasing what was "
            "there): its time grows with n like the linear variant's, not like softmax's n².")
        lay.addWidget(self.bridge)
        lay.addStretch(1)

        self.text.editingFinished.connect(self.recompute)
        self.decay.valueChanged.connect(self.recompute)
        self.beta.valueChanged.connect(self.recompute)
        self.seed.valueChanged.connect(self.recompute)
        self.fixed_beta.toggled.connect(self._beta_toggled)
        self._fill_table(L.no_softmax_costs())
        self.recompute()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        wide = event.size().width() >= SIDE_BY_SIDE_PX
        self.maps.setDirection(QBoxLayout.LeftToRight if wide else QBoxLayout.TopToBottom)

    def _beta_toggled(self, on: bool) -> None:
        self.beta.setEnabled(on)
        self.recompute()

    def recompute(self) -> None:
        self.message.setText("Computing…")
        beta = self.beta.value() if self.fixed_beta.isChecked() else None
        self.state.submit(L.no_softmax_compare, self.text.text(), self.decay.value(), beta, self.seed.value(),
                          key=LANE, uses_model=False, on_result=self._computed, on_error=self._refused)

    def _refused(self, message: str) -> None:
        self.result = None
        self.message.setText(message)

    def _computed(self, c) -> None:
        self.result = c
        self.message.setText("")
        n = len(c.tokens)
        ticks = [[(i + 0.5, t) for i, t in enumerate(c.tokens)], []]
        step = max(1, -(-n // 8))  # the keys' axis: token numbers, every step-th (words would overlap)
        numbers = [[(i + 0.5, str(i)) for i in range(0, n, step)], []]
        for plot, img, bar, values, levels in (
                (self.soft_plot, self.soft_img, self.soft_bar, c.softmax, (0.0, 1.0)),
                (self.delta_plot, self.delta_img, self.delta_bar, c.deltanet, signed_levels(c.deltanet))):
            img.setImage(values.astype(np.float32), levels=levels, autoLevels=False)
            img.setRect(QRectF(0, 0, n, n))
            bar.setLevels(values=levels)
            p = plot.getPlotItem()
            p.getAxis("left").setTicks(ticks)
            p.getAxis("bottom").setTicks(numbers)
            p.setLabel("bottom", "key (column): token number")
            p.setRange(xRange=(0, n), yRange=(0, n), padding=0)
        self.soft_bar.setColorMap(colormap(self.state.colormap))
        beta = (f"β = {float(c.beta[0]):.2f} for every token" if np.ptp(c.beta) == 0
                else f"β from each token ({float(c.beta.min()):.2f}–{float(c.beta.max()):.2f})")
        self.maps_note.setText(
            f"Left: every row sums to 1 and no weight is below 0. Right: blue &lt; 0 (white) &lt; red; its rows sum "
            f"to {float(c.row_sums.min()):+.2f}…{float(c.row_sums.max()):+.2f}, and {c.negative:.0%} of its weight "
            f"is negative — not probabilities, so entropy and the like do not apply. A @ V reproduces the delta "
            f"rule's output to {c.reproduces:.1e} (the map is exact, not an approximation). Decay {c.decay:g} per "
            f"token, {beta}, seed {c.seed}. <b>Untrained (random weights).</b>")
        self._draw_decay(c)

    def _draw_decay(self, c) -> None:
        p = self.decay_plot.getPlotItem()
        p.clear()
        p.legend.clear()
        p.plot(c.distance.astype(float), c.last_row, pen=pg.mkPen("#b2182b", width=2), symbol="o",
               symbolSize=6, symbolBrush="#b2182b", symbolPen=None, name=f'|A| of "{html.escape(c.tokens[-1])}"')
        p.plot(c.distance.astype(float), c.envelope, pen=pg.mkPen("#555", width=1.5, style=Qt.DashLine),
               name=f"bound: decay^(t−s) = {c.decay:g}^(t−s)")
        p.setYRange(0, 1.05, padding=0)
        far = int(np.argmax(c.envelope < 0.05)) if (c.envelope < 0.05).any() else None
        self.decay_note.setText(
            f"Each token keeps {c.decay:g} of the state, so a token s steps back reaches the last query through at "
            f"most {c.decay:g}^s of its write (the dashed line: |A[t, s]| ≤ β_s·decay^(t−s)·|q_t|, since |k| = 1 "
            "and erasing never enlarges the state), less where β was small or later writes erased it. "
            + (f"Past about {far} tokens back less than 5 % is left: this head keeps the recent words."
               if far is not None else
               f"Under 5 % would be left only about {np.log(0.05) / np.log(c.decay):.0f} tokens back, beyond this "
               "sentence: here the erasing (β) does more than the decay." if c.decay < 1 else
               "With no decay, only the delta rule's erasing makes old tokens fade."))

    def _fill_table(self, rows) -> None:
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            cells = [f"{r.n:,}", f"{_number(r.softmax_flops)} MACs", f"{_number(r.softmax_memory)} numbers",
                     f"{_number(r.recurrent_flops)} MACs", f"{_number(r.recurrent_memory)} numbers",
                     _number(r.map_cells)]
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(i, j, item)
        h = self.table.horizontalHeader().height() + sum(self.table.rowHeight(i) for i in range(len(rows)))
        self.table.setFixedHeight(h + 2 * self.table.frameWidth() + 2)

    def cell_texts(self) -> list[list[str]]:
        return [[self.table.item(i, j).text() for j in range(self.table.columnCount())]
                for i in range(self.table.rowCount())]
