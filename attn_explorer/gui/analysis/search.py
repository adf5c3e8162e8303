"""The head-search page: every head ranked by how well it follows a pattern you pick.

Patterns: the previous or next token, the [CLS] sink, each token itself, a fixed offset (i → i+k), or
one word to another ("it → animal"). A head's score is the share of its weight, on the pattern's rows,
that lands on the pattern's keys. The L×H map shows every score; the list names the best heads, and
clicking a cell or a line opens that head.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QComboBox, QLabel, QLineEdit, QListWidget, QSpinBox, QVBoxLayout
from superqt.utils import signals_blocked

from attn_explorer.gui.analysis.common import AnalysisPage, cell_plot, label_cells, untrained_tag
from attn_explorer.gui.widgets.heatmap import cell_centre, cell_under, colormap, set_bar_label
from attn_explorer.session.analysis import search_job
from attn_explorer.session.mixers import overview_note, probability_heads, recurrent_layers
from attn_explorer.session.state import SessionState

PATTERNS = [("pair", "query word → key word"), ("previous", "previous token"), ("next", "next token"),
            ("cls", "[CLS] sink"), ("self", "itself"), ("offset", "offset i → i+k")]

TOP = 10  # heads listed beside the map


def ranking_line(layer: int, head: int, score: float) -> str:
    return f"L{layer} H{head}   {score:.0%} on the pattern"


class HeadSearchPage(AnalysisPage):
    def __init__(self, state: SessionState, parent=None):
        super().__init__(state, parent)
        self.unused_note(hide="a head's score is the share of its weight on the pattern, counting every token",
                         log="scores run from 0 to 1 on a plain scale")
        self.pattern = QComboBox()
        for key, title in PATTERNS:
            self.pattern.addItem(title, key)
        self.query_edit = QLineEdit("it")
        self.key_edit = QLineEdit("animal")
        for e in (self.query_edit, self.key_edit):
            e.setMaximumWidth(120)
        self.offset = QSpinBox()
        self.offset.setRange(-64, 64)
        self.offset.setValue(-1)
        bar = self.control_row
        for w in (QLabel("pattern"), self.pattern, QLabel("query"), self.query_edit, QLabel("→ key"), self.key_edit,
                  QLabel("k"), self.offset):
            bar.addWidget(w)
        bar.addStretch(1)
        self.plot = cell_plot(self.canvas, 0, 0)
        self.plot.setLabel("left", "layer")
        self.plot.setLabel("bottom", "head")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.cbar = pg.ColorBarItem(values=(0, 1), colorMap=colormap(state.colormap), interactive=False, width=12)
        self.cbar.setImageItem(self.image, insert_in=self.plot)
        set_bar_label(self.cbar, "score")
        self.ranking = QListWidget()
        self.ranking.setToolTip("The best heads, with the share of their weight on the pattern; click one to open it")
        fm = self.ranking.fontMetrics()  # wide enough for its longest line, so nothing is cut off at 1024 px
        self.ranking.setFixedWidth(fm.horizontalAdvance(ranking_line(11, 11, 1.0)) + 2 * fm.averageCharWidth() + 24)
        self.ranking_title = QLabel(f"best {TOP} heads")
        side = QVBoxLayout()
        side.addWidget(self.ranking_title)
        side.addWidget(self.ranking, 1)
        self.add_side(side)  # the list sits beside the map
        self.scores: np.ndarray | None = None
        self.ranked: list = []
        self._enable_fields()
        self.pattern.currentIndexChanged.connect(lambda *_: (self._enable_fields(), self.refresh()))
        for e in (self.query_edit, self.key_edit):
            e.editingFinished.connect(self.refresh)
        self.offset.valueChanged.connect(lambda *_: self.refresh())
        self.ranking.itemActivated.connect(self._picked)
        self.ranking.itemClicked.connect(self._picked)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.attention_ready.connect(self.refresh)
        state.options_changed.connect(self.refresh)
        state.model_loaded.connect(self._model_loaded)

    def _model_loaded(self, info) -> None:
        if info.modality == "image" and self.pattern.currentData() == "pair":
            with signals_blocked(self.pattern):  # patches have no words: start on the [CLS] sink
                self.pattern.setCurrentIndex(self.pattern.findData("cls"))
            self._enable_fields()

    def _enable_fields(self) -> None:
        p = self.pattern.currentData()
        self.query_edit.setEnabled(p == "pair")
        self.key_edit.setEnabled(p == "pair")
        self.offset.setEnabled(p == "offset")

    def set_pattern(self, key: str, query: str = "", word: str = "", offset: int | None = None) -> None:
        """Choose a pattern (tests and scripts): what the controls would do."""
        if query:
            self.query_edit.setText(query)
        if word:
            self.key_edit.setText(word)
        if offset is not None:
            self.offset.setValue(int(offset))
        self.pattern.setCurrentIndex(self.pattern.findData(key))
        self.refresh()

    def refresh(self, *_):
        self.readout.setText("")
        r = self.result_to_draw()
        if r is None:
            return
        # the old ranking described another pattern or input: gone until the new one arrives
        self.scores, self.ranked = None, []
        self.ranking.clear()
        self.caption.setText("")
        self.stack.show_message("Ranking the heads…")
        args = (r.attentions, r.special, list(r.tokens), self.pattern.currentData(), self.query_edit.text(),
                self.key_edit.text(), int(self.offset.value()),
                TOP if not recurrent_layers(self.state.info) else int(np.prod(r.attentions.shape[:2])))
        self.state.submit(search_job, *args, key="analysis-search", on_result=lambda out: self._arrived(r, args[3:7], out),
                          on_error=self._failed, uses_model=False)

    def _arrived(self, r, asked, out) -> None:
        now = (self.pattern.currentData(), self.query_edit.text(), self.key_edit.text(), int(self.offset.value()))
        if r is not self.state.result or tuple(asked) != now:
            return
        _target, self.scores, self.ranked = out
        L, H = self.scores.shape
        # issue 25: a hybrid's recurrent layers (signed maps: no share of weight) and padded heads stay blank
        ok = probability_heads(self.state.info, L, H)
        self.scores = np.where(ok, self.scores, np.nan)
        self.ranked = [s for s in self.ranked if ok[s.layer, s.head]][:TOP]  # all were asked for on a hybrid
        if not self.ranked:
            self.stack.show_message("No softmax head to rank.")
            return
        self.stack.show_canvas()
        self.image.setImage(self.scores.astype(np.float32), levels=(0.0, 1.0), autoLevels=False)
        self.image.setRect(QRectF(0, 0, H, L))
        self.cbar.setColorMap(colormap(self.state.colormap))
        self.plot.setRange(xRange=(0, H), yRange=(0, L), padding=0.02)
        label_cells(self.plot, L, H)
        self.plot.setTitle(f"score per head: {self.pattern.currentText()}")
        for s in self.ranked:
            self.ranking.addItem(ranking_line(s.layer, s.head, s.score))
        best = self.ranked[0]
        self.caption.setText(f"<b>Head search</b> — best match: <b>L{best.layer} H{best.head}</b> puts {best.score:.0%} "
                             "of its weight where the pattern says (mean over the pattern's rows). Click a head to "
                             "open it." + overview_note(self.state.info, L) + untrained_tag(self.state.info))

    def _failed(self, message: str) -> None:
        self.caption.setText(message)  # a word that is not in the input: say so here, where it was typed, once
        self.stack.show_message("No ranking: the line above says why.")

    def _cell(self, pos):
        return None if self.scores is None else cell_under(self.plot, pos, self.scores.shape)

    def cell_center(self, layer: int, head: int):
        return cell_centre(self.plot, layer, head)

    def _hovered(self, pos) -> None:
        hit = self._cell(pos)
        if hit:
            v = float(self.scores[hit])
            self.readout.setText(f"L{hit[0]} H{hit[1]}: " + (f"score {v:.3f}" if np.isfinite(v) else
                                                             "does not apply (a recurrent layer or absent head)"))

    def _clicked(self, ev) -> None:
        hit = self._cell(ev.scenePos())
        if hit:
            self.open_head(*hit)

    def _picked(self, item) -> None:
        row = self.ranking.row(item)
        if 0 <= row < len(self.ranked):
            s = self.ranked[row]
            self.open_head(s.layer, s.head)
