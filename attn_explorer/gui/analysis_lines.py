"""The lines page: bertviz's head view, drawn natively with a QGraphicsScene.

Queries on the left, keys on the right; a line joins query i to key j with opacity α_ij, one colour per
head, several heads at once (the chips above pick them; the selected head starts alone). Hovering a
token keeps only its lines: its own attention on the left, who looks at it on the right. Lines are
for short inputs: longer ones show their first MAX_TOKENS tokens and say so.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPen
from PySide6.QtWidgets import (QCheckBox, QGraphicsScene, QGraphicsView, QHBoxLayout, QLabel, QVBoxLayout, QWidget)

from attn_explorer.gui.analysis_common import untrained_tag
from attn_explorer.gui.heatmap import LazyPage, short
from attn_explorer.session.state import SessionState

MAX_TOKENS = 96  # beyond this the columns are too tall to read
MIN_WEIGHT = 0.02  # lighter lines are not drawn (they would be invisible anyway)
ROW = 20  # pixels per token
GAP = 260  # pixels between the two columns
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]


def head_colour(h: int) -> QColor:
    return QColor(PALETTE[h % len(PALETTE)])


class LineCanvas(QGraphicsView):
    """The two token columns and their lines. `hovered(side, index)`: side is "query", "key" or ""."""

    hovered = Signal(str, int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.setRenderHint(QPainter.Antialiasing)
        self.setMouseTracking(True)
        self.setAlignment(Qt.AlignHCenter | Qt.AlignTop)
        self.setBackgroundBrush(QColor("white"))
        self.n = 0
        self.label_w = 120
        self.lines: list[tuple[int, int, int, object]] = []  # (head, query, key, item)
        self.labels: list[tuple[object, object]] = []  # (query text, key text) per token

    def draw(self, att: np.ndarray, heads: list[int], tokens: list[str]) -> None:
        """att: (H, n, n) of one layer, cut to the tokens shown."""
        sc = self.scene()
        sc.clear()
        self.lines, self.labels = [], []
        n = self.n = len(tokens)
        font = QFont()
        font.setPointSize(10)
        texts = [short(t, 18) for t in tokens]
        w = self.label_w = 120
        for i, t in enumerate(texts):
            left = sc.addText(t, font)
            left.setPos(w - left.boundingRect().width(), i * ROW - 4)
            right = sc.addText(t, font)
            right.setPos(w + GAP, i * ROW - 4)
            self.labels.append((left, right))
        x0, x1 = w + 4, w + GAP - 4
        for h in heads:
            colour = head_colour(h)
            ii, jj = np.nonzero(att[h] >= MIN_WEIGHT)
            for i, j in zip(ii.tolist(), jj.tolist()):
                c = QColor(colour)
                c.setAlphaF(float(min(1.0, att[h, i, j])))
                pen = QPen(c, 2)
                y0, y1 = i * ROW + ROW / 2, j * ROW + ROW / 2
                item = sc.addLine(x0, y0, x1, y1, pen)
                self.lines.append((h, i, j, item))
        sc.setSceneRect(-10, -10, 2 * w + GAP + 20, n * ROW + 20)

    def focus(self, side: str, index: int) -> None:
        """Show only the lines of one token (side "query" or "key"), or every line (side "")."""
        for _h, i, j, item in self.lines:
            item.setVisible(not side or (i if side == "query" else j) == index)
        for k, (left, right) in enumerate(self.labels):
            bold = (side == "query" and k == index, side == "key" and k == index)
            for item, b in zip((left, right), bold):
                item.setDefaultTextColor(QColor("#d62728") if b else QColor("#222"))

    def token_at(self, scene_pos: QPointF) -> tuple[str, int]:
        i = int(scene_pos.y() // ROW)
        if not 0 <= i < self.n:
            return "", -1
        if scene_pos.x() < self.label_w + 4:
            return "query", i
        if scene_pos.x() > self.label_w + GAP - 4:
            return "key", i
        return "", -1

    def token_pos(self, side: str, index: int) -> QPointF:
        """Scene position over a token's label (tests hover here)."""
        x = self.label_w - 20 if side == "query" else self.label_w + GAP + 20
        return QPointF(x, index * ROW + ROW / 2)

    def mouseMoveEvent(self, ev):  # noqa: N802 - Qt API
        super().mouseMoveEvent(ev)
        side, i = self.token_at(self.mapToScene(ev.position().toPoint()))
        self.focus(side, i)
        self.hovered.emit(side, i)

    def leaveEvent(self, ev):  # noqa: N802 - Qt API
        super().leaveEvent(ev)
        self.focus("", -1)
        self.hovered.emit("", -1)


class LinesPage(LazyPage, QWidget):
    head_opened = Signal(int, int)

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        self.chips_row = QHBoxLayout()
        self.chips: list[QCheckBox] = []
        self.chips_row.addWidget(QLabel("heads:"))
        self.chips_row.addStretch(1)
        self.view = LineCanvas()
        self.readout = QLabel("Hover a token to keep only its lines.")
        self.readout.setStyleSheet("font-family: monospace;")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.caption)
        lay.addLayout(self.chips_row)
        lay.addWidget(self.view, 1)
        lay.addWidget(self.readout)
        self.view.hovered.connect(self._hovered)
        state.attention_ready.connect(self.refresh)
        state.selection_changed.connect(self._selection)
        state.model_loaded.connect(lambda *_: self._make_chips())

    def _make_chips(self) -> None:
        info = self.state.info
        H = info.num_heads if info is not None else 0
        if len(self.chips) == H:
            return
        for c in self.chips:
            self.chips_row.removeWidget(c)
            c.deleteLater()
        self.chips = []
        for h in range(H):
            c = QCheckBox(f"H{h}")
            c.setStyleSheet(f"QCheckBox {{ color: {head_colour(h).name()}; font-weight: bold; }}")
            c.setChecked(h == self.state.head)
            c.toggled.connect(lambda *_: self.refresh())
            self.chips_row.insertWidget(self.chips_row.count() - 1, c)
            self.chips.append(c)

    def heads(self) -> list[int]:
        return [h for h, c in enumerate(self.chips) if c.isChecked()]

    def set_heads(self, heads) -> None:
        want = set(int(h) for h in heads)
        for h, c in enumerate(self.chips):
            c.blockSignals(True)
            c.setChecked(h in want)
            c.blockSignals(False)
        self.refresh()

    def _selection(self, layer: int, head: int) -> None:
        if len(self.heads()) <= 1:  # following the selection until the user picks several heads
            self.set_heads([head])
        else:
            self.refresh()

    def refresh(self, *_):
        self.readout.setText("Hover a token to keep only its lines.")
        if not self.needs_draw():
            return
        r = self.state.result
        if r is None:
            return
        self._make_chips()
        n = min(r.num_tokens, MAX_TOKENS)
        layer = self.state.layer
        att = r.attentions[layer][:, :n, :n]
        heads = self.heads()
        self.view.draw(att, heads, list(r.tokens[:n]))
        cut = (f" Showing the first {n} of {r.num_tokens} tokens (rows are not renormalised)."
               if n < r.num_tokens else "")
        names = ", ".join(f"H{h}" for h in heads) or "none (tick a head above)"
        self.caption.setText(f"<b>Layer {layer}</b>, heads {names}: query tokens on the left, keys on the right; "
                             f"a line's opacity is its weight (below {MIN_WEIGHT} not drawn).{cut}"
                             + untrained_tag(self.state.info))

    def _hovered(self, side: str, i: int) -> None:
        r = self.state.result
        if r is None or not side or i >= r.num_tokens:
            self.readout.setText("Hover a token to keep only its lines.")
            return
        layer, heads = self.state.layer, self.heads()
        if not heads:
            return
        h = heads[0]
        row = r.attentions[layer, h, i] if side == "query" else r.attentions[layer, h, :, i]
        top = np.argsort(row)[::-1][:3]
        what = "looks at" if side == "query" else "is looked at by"
        self.readout.setText(f'H{h}: "{r.tokens[i]}" {what} ' +
                             ", ".join(f'"{r.tokens[j]}" {row[j]:.2f}' for j in top))
