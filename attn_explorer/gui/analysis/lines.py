"""The lines page: bertviz's head view, drawn natively with a QGraphicsScene.

Queries on the left, keys on the right; a line joins query i to key j with opacity α_ij, one colour per
head, several heads at once (the chips above pick them; the selected head starts alone). Hovering a
token keeps only its lines: its own attention on the left, who looks at it on the right. Lines are
for short inputs: longer ones show their first MAX_TOKENS tokens and say so.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QCheckBox, QGraphicsScene, QGraphicsView, QLabel, QWidget

from superqt.utils import signals_blocked

from attn_explorer.gui.analysis.common import AnalysisPage, untrained_tag
from attn_explorer.gui.widgets.heatmap import short
from attn_explorer.maths import kept_tokens, without_specials
from attn_explorer.session.mixers import mixer_label
from attn_explorer.session.state import SessionState

MAX_TOKENS = 96  # beyond this the columns are too tall to read
MIN_WEIGHT = 0.02  # lighter lines are not drawn (they would be invisible anyway)
TOP_PER_ROW = 12  # and at most this many keys per query and head: painting is what costs
ROW = 20  # pixels per token
GAP = 260  # pixels between the two columns
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]


def head_colour(h: int) -> QColor:
    return QColor(PALETTE[h % len(PALETTE)])


class LineCanvas(QGraphicsView):
    """The two token columns and their lines. `hovered(side, index)`: side is "query", "key" or "".

    Lines are drawn as one path per head and opacity level (LEVELS of them), not one item per line, so
    twelve heads of 96 tokens stay quick; hovering rebuilds the paths from the hovered token's links only."""

    hovered = Signal(str, int)
    LEVELS = 16

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.setRenderHint(QPainter.Antialiasing)
        self.setMouseTracking(True)
        self.setAlignment(Qt.AlignHCenter | Qt.AlignTop)
        self.setBackgroundBrush(QColor("white"))
        self.n = 0
        self.label_w = 120
        self.links = np.zeros((0, 4))  # (head, query, key, weight) of every line at or above MIN_WEIGHT
        self.shown = np.zeros((0, 4))  # the links drawn now (all of them, or one token's)
        self.labels: list[tuple[object, object]] = []  # (query text, key text) per token
        self._paths: list = []
        self._focus = ("", -1)

    def draw(self, att: np.ndarray, heads: list[int], tokens: list[str]) -> None:
        """att: (H, n, n) of one layer, cut to the tokens shown."""
        sc = self.scene()
        sc.clear()
        self.labels, self._paths = [], []
        n = self.n = len(tokens)
        font = QFont()
        font.setPointSize(10)
        w = self.label_w = 120
        for i, t in enumerate(short(t, 18) for t in tokens):
            left = sc.addText(t, font)
            left.setPos(w - left.boundingRect().width(), i * ROW - 4)
            right = sc.addText(t, font)
            right.setPos(w + GAP, i * ROW - 4)
            self.labels.append((left, right))
        rows = []
        for h in heads:
            m = att[h]
            if m.shape[-1] > TOP_PER_ROW:
                kth = -np.partition(-m, TOP_PER_ROW - 1, axis=-1)[:, TOP_PER_ROW - 1: TOP_PER_ROW]  # (n, 1)
                m = np.where(m >= kth, m, 0.0)
            ii, jj = np.nonzero(m >= MIN_WEIGHT)
            rows.append(np.stack([np.full(ii.size, h), ii, jj, att[h, ii, jj]], axis=1))
        self.links = np.concatenate(rows) if rows else np.zeros((0, 4))
        sc.setSceneRect(-10, -10, 2 * w + GAP + 20, n * ROW + 20)
        self._focus = ("", -1)
        self._draw_links(self.links)

    def _draw_links(self, links: np.ndarray) -> None:
        sc = self.scene()
        for item in self._paths:
            sc.removeItem(item)
        self._paths = []
        self.shown = links
        x0, x1 = self.label_w + 4, self.label_w + GAP - 4
        width = 2.0 if len(links) <= 2000 else 1.0  # wide antialiased lines paint slowly by the thousand
        level = np.minimum((links[:, 3] * self.LEVELS).astype(int), self.LEVELS - 1) if len(links) else []
        for h in np.unique(links[:, 0]).astype(int) if len(links) else []:
            for lv in range(self.LEVELS):
                sel = links[(links[:, 0] == h) & (level == lv)]
                if not len(sel):
                    continue
                path = QPainterPath()
                for _h, i, j, _w in sel:
                    path.moveTo(x0, i * ROW + ROW / 2)
                    path.lineTo(x1, j * ROW + ROW / 2)
                c = head_colour(h)
                c.setAlphaF(min(1.0, (lv + 0.5) / self.LEVELS))
                pen = QPen(c, width)
                pen.setCosmetic(True)
                item = sc.addPath(path, pen)
                item.setZValue(lv)  # stronger lines on top
                self._paths.append(item)

    def focus(self, side: str, index: int) -> None:
        """Show only the lines of one token (side "query" or "key"), or every line (side "")."""
        if (side, index) == self._focus:
            return
        self._focus = (side, index)
        links = self.links if not side else self.links[self.links[:, 1 if side == "query" else 2] == index]
        self._draw_links(links)
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


class LinesPage(AnalysisPage):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        self.view = LineCanvas()
        super().__init__(state, parent, content=self.view)
        self.chips_row = self.control_row
        self.chips: list[QCheckBox] = []
        self.chips_row.addWidget(QLabel("heads:"))
        self.chips_row.addStretch(1)
        self.unused_note(log=f"a line's opacity is its weight, and lines under {MIN_WEIGHT} are not drawn")
        self.att: np.ndarray | None = None  # (H, n, n) of the layer drawn: cut, special tokens gone when hidden
        self.tokens: list[str] = []  # its tokens
        self.readout.setText("Hover a token to keep only its lines.")
        self.view.hovered.connect(self._hovered)
        state.attention_ready.connect(self.refresh)
        state.selection_changed.connect(self._selection)
        state.options_changed.connect(self.refresh)
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
            with signals_blocked(c):
                c.setChecked(h in want)
        self.refresh()

    def _selection(self, layer: int, head: int) -> None:
        if len(self.heads()) <= 1:  # following the selection until the user picks several heads
            self.set_heads([head])
        else:
            self.refresh()

    def refresh(self, *_):
        self.readout.setText("Hover a token to keep only its lines.")
        r = self.result_to_draw()
        if r is None:
            return
        self._make_chips()
        self.stack.show_canvas()
        layer = self.state.layer
        kept = kept_tokens(r.special, r.num_tokens, self.state.hide_special)
        signed = mixer_label(self.state.info, layer)  # issue 25: a recurrent layer's signed implicit map
        if signed:  # opacity from |A| scaled to the layer's largest; specials dropped, rows not renormalised
            a = np.abs(np.asarray(r.attentions[layer], dtype=np.float32))[:, kept][:, :, kept]
            att = a / max(float(a.max()), 1e-30)
        else:
            att = (without_specials(r.attentions[layer], r.special) if len(kept) < r.num_tokens
                   else r.attentions[layer])
        n = min(len(kept), MAX_TOKENS)
        self.att, self.tokens = att[:, :n, :n], [r.tokens[i] for i in kept[:n]]
        heads = self.heads()
        self.view.draw(self.att, heads, self.tokens)
        hidden = len(kept) < r.num_tokens
        cut = (f" Showing the first {n} of {len(kept)} tokens (rows are not renormalised to the cut)."
               if n < len(kept) else "")
        if hidden:
            cut += (f" Special tokens hidden: {len(kept)} of {r.num_tokens} tokens"
                    + (" (not renormalised: a signed map)." if signed else ", rows renormalised over them."))
        names = ", ".join(f"H{h}" for h in heads) or "none (tick a head above)"
        self.caption.setText(f"<b>Layer {layer}</b>, heads {names}: query tokens on the left, keys on the right; "
                             f"a line's opacity is its weight (lines below {MIN_WEIGHT}, and beyond each query's {TOP_PER_ROW} strongest "
                             f"keys, are not drawn).{cut}"
                             + (f" <b>{signed}</b>: not probabilities; here a line's opacity is |A| ÷ the layer's "
                                "largest |A| (the sign is not drawn: the head pages show it)." if signed else "")
                             + untrained_tag(self.state.info))

    def _hovered(self, side: str, i: int) -> None:
        att, tokens = self.att, self.tokens
        if att is None or not side or i >= len(tokens):
            self.readout.setText("Hover a token to keep only its lines.")
            return
        heads = self.heads()
        if not heads:
            return
        h = heads[0]
        row = att[h, i] if side == "query" else att[h, :, i]
        top = np.argsort(row)[::-1][:3]
        what = "looks at" if side == "query" else "is looked at by"
        self.readout.setText(f'H{h}: "{tokens[i]}" {what} ' +
                             ", ".join(f'"{tokens[j]}" {row[j]:.2f}' for j in top))
