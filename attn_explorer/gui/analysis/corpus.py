"""The Corpus page: what a head does over many sentences, not one.

Load a text file (one sentence a line) or take the text box's lines, choose heads ("5:0, 2:1"), and
gather: each sentence runs once through the model in a worker, with progress and Cancel. Then, for the
head shown, its queries (dots) and keys (crosses) in one picture (PCA, or UMAP when umap-learn is
installed; the keys aligned as AttentionViz does, which changes no attention weight), coloured by
position, token or sentence; the corpus-wide mean and spread of the head overview's statistics; and the
sentences where the head fires most. Clicking a point or a sentence opens it in the One-head view with
that token as the query.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QListWidget,
                               QPushButton, QVBoxLayout)
from superqt.utils import signals_blocked

from attn_explorer.errors import UserError
from attn_explorer.files import read_text_file
from attn_explorer.gui.analysis.common import AnalysisPage, untrained_tag
from attn_explorer.session.corpus import (ALIGN_NOTE, embedding_job, gather_job, parse_heads, read_sentences,
                                          umap_available)
from attn_explorer.session.state import SessionState

GATHER, EMBED = "corpus-gather", "corpus-embed"
COLOURS = (("position", "position in the sentence"), ("token", "token"), ("sentence", "sentence"))
STAT_LINES = (("entropy", "entropy", "bits"), ("sink", "on special/first", ""), ("distance", "distance", None),
              ("prev", "previous token", ""), ("next", "next token", ""))
MAX_POINTS = 4000
TOP = 8


def colour_values(points, by: str) -> np.ndarray:
    """A number in [0, 1] per token, for the colour map: position (0 = first), token (a stable hash, so a
    word keeps its colour) or sentence."""
    if by == "position":
        v = points.position.astype(np.float64)
    elif by == "sentence":
        v = points.sentence.astype(np.float64)
    else:
        v = np.array([zlib.crc32(t.encode("utf-8")) % 997 for t in points.token], dtype=np.float64)
    top = v.max() if v.size else 0.0
    return v / top if top > 0 else np.zeros_like(v)


def stat_line(corpus, layer: int, head: int) -> list[str]:
    """The corpus-wide mean ± spread of each statistic for one head."""
    out = []
    for name, title, unit in STAT_LINES:
        unit = corpus.distance_unit if unit is None else unit
        v = corpus.stats[name][:, layer, head]
        if name in ("sink", "prev", "next"):
            out.append(f"{title}: {v.mean():.0%} ± {v.std():.0%}")
        else:
            out.append(f"{title}: {v.mean():.2f} ± {v.std():.2f} {unit}".rstrip())
    return out


class CorpusPage(AnalysisPage):
    FOLLOWS_INPUT = False  # its sentences are its own input: emptying the text box leaves the corpus as it is
    def __init__(self, state: SessionState, parent=None):
        super().__init__(state, parent, mono_readout=False)  # the embedding's note is a sentence, not a number
        self.unused_note(hide="every token of every sentence is gathered; special tokens are drawn like the rest",
                         log="the picture has no weights to scale")
        self.sentences: list[str] = []
        self.source = ""  # where the sentences came from, for the captions
        self.corpus = None  # the gathered Corpus (plain NumPy), or None
        self.embedding = None  # the shown head's Embedding
        self._embedded_for = None  # (head, method) the embedding describes
        self._gathered_with = None  # the ModelInfo the corpus came from
        self._pending_open = None  # (layer, head, token) to select once the opened sentence has run

        self.open_button = QPushButton("Open file…")
        self.open_button.setToolTip("A UTF-8 text file, one sentence a line (blank lines are skipped)")
        self.lines_button = QPushButton("Text box lines")
        self.lines_button.setToolTip("Take the text box's lines as the sentences, one a line")
        self.heads_edit = QLineEdit()
        self.heads_edit.setPlaceholderText("layer:head, …")
        self.heads_edit.setToolTip("Heads whose queries and keys to keep, like 5:0, 2:1 (empty: the selected head)")
        self.heads_edit.setMaximumWidth(110)
        self.gather_button = QPushButton("Gather")
        self.head_choice = QComboBox()
        self.head_choice.setToolTip("The gathered head shown")
        self.colour = QComboBox()
        for key, title in COLOURS:
            self.colour.addItem(f"colour: {title}", key)
        self.method = QComboBox()
        self.method.addItem("PCA", "pca")
        self.method.addItem("UMAP", "umap")
        if not umap_available():
            self.method.model().item(1).setEnabled(False)
            self.method.setItemData(1, "UMAP needs umap-learn (pip install umap-learn)", Qt.ToolTipRole)
        bar = self.control_row
        for w in (self.open_button, self.lines_button, QLabel("heads"), self.heads_edit, self.gather_button):
            bar.addWidget(w)
        bar.addStretch(1)
        view_bar = QHBoxLayout()
        for w in (self.head_choice, self.colour, self.method):
            view_bar.addWidget(w)
        view_bar.addStretch(1)
        self.add_row(view_bar)

        self.plot = self.canvas.addPlot(row=0, col=0)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setAspectLocked(False)
        self.plot.addLegend(offset=(8, 8))
        self.queries = pg.ScatterPlotItem(size=6, symbol="o", pen=None, brush=pg.mkBrush("#555"), name="queries")
        self.keys = pg.ScatterPlotItem(size=7, symbol="x", pen=pg.mkPen("#555", width=1.5), name="keys")
        self.plot.addItem(self.queries)
        self.plot.addItem(self.keys)
        self.queries.sigClicked.connect(lambda _item, pts, *_: self._point_clicked(pts, 0))
        self.keys.sigClicked.connect(lambda _item, pts, *_: self._point_clicked(pts, 1))

        self.stats_label = QLabel("")
        self.stats_label.setWordWrap(True)
        self.stats_label.setTextFormat(Qt.PlainText)
        self.top_list = QListWidget()
        self.top_list.setToolTip("The sentences where this head fires most (its largest weight from one word to "
                                 "another); click one to open it")
        self.top_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.top_list.setTextElideMode(Qt.ElideRight)
        for w in (self.stats_label, self.top_list):
            w.setMaximumWidth(260)
        side = QVBoxLayout()
        side.addWidget(QLabel("over the corpus (mean ± spread)"))
        side.addWidget(self.stats_label)
        side.addWidget(QLabel("fires most in"))
        side.addWidget(self.top_list, 1)
        self.add_side(side, (3, 1))
        self._prompt()
        for w in (self.head_choice, self.colour, self.method):
            w.setEnabled(False)  # nothing to choose until a corpus is gathered

        self.open_button.clicked.connect(self._open_file)
        self.lines_button.clicked.connect(self._use_text_lines)
        self.gather_button.clicked.connect(self.gather)
        self.head_choice.currentIndexChanged.connect(lambda *_: self._show_head())
        self.method.currentIndexChanged.connect(lambda *_: self._show_head())
        self.colour.currentIndexChanged.connect(lambda *_: self._draw_points())
        self.top_list.itemClicked.connect(self._top_clicked)
        self.top_list.itemActivated.connect(self._top_clicked)
        state.model_loaded.connect(self._model_loaded)
        state.attention_ready.connect(self._opened_ran)
        self._update_caption()

    # ---------------------------------------------------------------------------------- input
    def refresh(self, *_):
        """The corpus does not follow the text box: nothing to redraw on a new run."""

    def _prompt(self) -> None:
        self.stack.show_message("Open a file of sentences (one a line), or use the text box's lines, then Gather.")

    def set_sentences(self, text: str, source: str) -> bool:
        """Take the sentences of `text` (one a line); a bad corpus goes to the banner and changes nothing."""
        try:
            sentences = read_sentences(text)
        except UserError as e:
            self.state.error_raised.emit(str(e))
            return False
        self.sentences, self.source = sentences, source
        self._update_caption()
        return True

    def load_file(self, path: str) -> bool:
        try:
            text = read_text_file(path)
        except UserError as e:
            self.state.error_raised.emit(str(e))
            return False
        return self.set_sentences(text, Path(path).name)

    def _open_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open sentences", "", "Text files (*.txt);;All files (*)")
        if path:
            self.load_file(path)

    def _use_text_lines(self) -> None:
        self.set_sentences(self.state.text, "the text box")

    # ---------------------------------------------------------------------------------- gather
    def gather(self) -> None:
        info = self.state.info
        if info is None:
            self.state.error_raised.emit("no model is loaded yet")
            return
        if info.modality != "text":
            self.state.error_raised.emit(f"{info.name} reads images; the corpus view takes sentences of text")
            return
        if not self.sentences:
            self.state.error_raised.emit("no sentences yet: open a file (one sentence a line) or use the text box's lines")
            return
        spec = self.heads_edit.text().strip() or f"{self.state.layer}:{self.state.head}"
        try:
            heads = parse_heads(spec, info.num_layers, info.num_heads)
        except UserError as e:
            self.state.error_raised.emit(str(e))
            return
        self.corpus, self.embedding, self._embedded_for = None, None, None
        self._clear_view()
        self.progress.start("", "%v / %m sentences", total=len(self.sentences))
        self.gather_button.setEnabled(False)
        self.stack.show_message(f"Gathering {len(self.sentences):,} sentences…")
        asked = info
        started = self.state.submit(gather_job, list(self.sentences), heads, MAX_POINTS, self.state.dk_scale,
                                    key=GATHER, on_yield=self._progressed,
                                    on_result=lambda c: self._gathered(asked, c), on_error=self._gather_failed)
        if not started:
            self._gather_failed("no model is loaded yet")

    def cancel(self) -> None:
        self.state.cancel(GATHER)
        self._idle()
        self.stack.show_message("Cancelled: nothing was kept. Gather again to start over.")

    def _progressed(self, item) -> None:
        self.progress.count(*item)  # (done, total)

    def _idle(self) -> None:
        self.gather_button.setEnabled(True)
        self.progress.finish()

    def _gathered(self, info, corpus) -> None:
        self.progress.bar.setValue(self.progress.bar.maximum())
        self._idle()
        if corpus is None:
            return
        self.corpus, self._gathered_with = corpus, info
        for w in (self.head_choice, self.colour, self.method):
            w.setEnabled(True)
        with signals_blocked(self.head_choice):
            self.head_choice.clear()
            for h in corpus.heads:
                self.head_choice.addItem(f"L{h.layer} H{h.head}", (h.layer, h.head))
        self._update_caption()
        self._show_head()

    def _gather_failed(self, message: str) -> None:
        self._idle()
        self.stack.show_message("Nothing gathered: the message at the top of the window says why.")
        self.state.error_raised.emit(message)

    def _model_loaded(self, info) -> None:
        """A new model: what was gathered described the old one."""
        self.state.cancel(GATHER)
        self.state.cancel(EMBED)
        self._idle()
        if self.corpus is not None:
            self.corpus, self.embedding, self._embedded_for = None, None, None
            with signals_blocked(self.head_choice):
                self.head_choice.clear()
            for w in (self.head_choice, self.colour, self.method):
                w.setEnabled(False)
            self._clear_view()
            self.stack.show_message(f"The model changed to {info.name}: gather again to see its heads.")
        else:
            self._prompt()
        self._update_caption()

    # ---------------------------------------------------------------------------------- show
    def shown_head(self) -> tuple[int, int] | None:
        return self.head_choice.currentData()

    def _show_head(self) -> None:
        head = self.shown_head()
        if self.corpus is None or head is None:
            return
        points = self.corpus.points(*head)
        self._side(head)
        if len(points.q) < 2:
            self.embedding, self._embedded_for = None, None
            self._clear_points()
            self.stack.show_message(f"L{head[0]} H{head[1]}: fewer than 2 tokens gathered, nothing to place.")
            return
        want = (head, self.method.currentData())
        if self._embedded_for == want:
            self._draw_points()
            return
        self.embedding, self._embedded_for = None, None
        self._clear_points()
        self.stack.show_message("Placing queries and keys…")
        self.state.submit(embedding_job, points, want[1], key=EMBED, uses_model=False,
                          on_result=lambda e: self._embedded(want, e), on_error=self._gather_failed)

    def _embedded(self, want, e) -> None:
        if self.corpus is None or (self.shown_head(), self.method.currentData()) != want:
            return  # the choice moved on; its own job is on the way
        self.embedding, self._embedded_for = e, want
        self._draw_points()

    def _draw_points(self) -> None:
        head = self.shown_head()
        if self.embedding is None or head is None or self.corpus is None:
            return
        points = self.corpus.points(*head)
        P = len(points.q)
        xy = self.embedding.xy
        cmap = pg.colormap.get("viridis")
        cols = cmap.map(colour_values(points, self.colour.currentData()), mode="qcolor")
        self.queries.setData(x=xy[:P, 0], y=xy[:P, 1], brush=cols, data=np.arange(P))
        self.keys.setData(x=xy[P:, 0], y=xy[P:, 1], pen=[pg.mkPen(c, width=1.5) for c in cols], brush=None,
                          data=np.arange(P))
        self.stack.show_canvas()
        ex = self.embedding.explained
        axes = (f"PCA 1 ({ex[0]:.0%} of the variance)", f"PCA 2 ({ex[1]:.0%})") if ex else ("UMAP 1", "UMAP 2")
        self.plot.setLabel("bottom", axes[0])
        self.plot.setLabel("left", axes[1])
        self.plot.setTitle(f"L{head[0]} H{head[1]}: {P:,} tokens, queries ● and keys ×")
        self.plot.autoRange()
        self.readout.setText(f"{self.embedding.method.upper()}; {ALIGN_NOTE}. Click a point to open its sentence.")

    def _side(self, head) -> None:
        c = self.corpus
        self.stats_label.setText("\n".join(stat_line(c, *head)))
        self.top_list.clear()
        self._top = c.top_sentences(head[0], head[1], TOP)
        for i, w in self._top:
            text = c.sentences[i]
            self.top_list.addItem(f"{w:.2f}  {text if len(text) <= 40 else text[:39] + '…'}")

    def _clear_points(self) -> None:
        self.queries.setData(x=[], y=[])
        self.keys.setData(x=[], y=[])
        self.plot.setTitle("")

    def _clear_view(self) -> None:
        self._clear_points()
        self.stats_label.setText("")
        self.top_list.clear()
        self._top = []
        self.readout.setText("")

    def _update_caption(self) -> None:
        n = len(self.sentences)
        what = f"{n:,} sentences from {self.source}" if n else "no sentences yet"
        c = self.corpus
        if c is not None:
            done = "" if c.complete else " (stopped early)"
            what = (f"{c.num_sentences:,} sentences, {c.tokens_seen:,} tokens gathered with {c.model}{done}; "
                    f"up to {MAX_POINTS:,} tokens a head kept for the picture")
        self.caption.setText(f"<b>Corpus</b> — {what}." + untrained_tag(self.state.info))

    # ---------------------------------------------------------------------------------- open
    def _point_clicked(self, pts, _kind: int) -> None:
        if not len(pts) or self.corpus is None:
            return
        i = int(pts[0].data())
        points = self.corpus.points(*self.shown_head())
        self.open_sentence(int(points.sentence[i]), int(points.position[i]))

    def _top_clicked(self, item) -> None:
        row = self.top_list.row(item)
        if 0 <= row < len(self._top):
            self.open_sentence(self._top[row][0], None)

    def open_sentence(self, index: int, token: int | None) -> None:
        """Put sentence `index` in the text box and, once it has run, show the head with `token` as the query."""
        if self.corpus is None:
            return
        if self._gathered_with is not self.state.info:
            self.state.error_raised.emit("the corpus was gathered with another model: gather again")
            return
        layer, head = self.shown_head()
        sentence = self.corpus.sentences[index]
        self._pending_open = (layer, head, token, sentence)
        if self.state.text == sentence and self.state.result is not None:
            self._opened_ran(self.state.result)
        else:
            self.state.set_text(sentence)

    def _opened_ran(self, result) -> None:
        if self._pending_open is None or self.corpus is None:
            return
        layer, head, token, sentence = self._pending_open
        if self.state.text != sentence:
            return  # a run of the text before it; the sentence's own run follows
        self._pending_open = None
        if token is not None:
            self.state.set_query(token)
        self.open_head(layer, head)
