"""The Atlas page: every head of a model over a whole corpus (issue 27 A and C).

Choose a corpus (the bundled one, a folder of .txt files, or text files; a document is a file, or a line),
a token budget, and Run: the session's model reads the corpus in a worker (`session.atlas.atlas_job`), with
progress and Cancel (or Esc). Then every head is a point, in any two chosen metrics or by PCA (UMAP when
installed) of its metric vector, coloured by layer; hovering says "L3 H5: induction 0.62, …"; clicking a
head lists its top (query, key) examples, the query and the key marked, with its suggested roles (the
thresholds stated under the list); clicking an example opens its document in the One-head view with that
query. Save atlas / Open atlas read and write one .npz, which opens without the model (the caption says
which model it came from). A second atlas (another model, or a file) is matched head to head and drawn
beside the first, the two scatters linked (`atlas_pair.PairPanel`).
"""
from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QHBoxLayout, QLabel, QPushButton, QSpinBox)

from superqt.utils import signals_blocked

from attn_explorer.errors import UserError
from attn_explorer.gui.analysis.atlas_examples import ExamplePanel, atlas_caption, hover_line, roles_text
from attn_explorer.gui.analysis.atlas_open import ExampleOpener
from attn_explorer.gui.analysis.atlas_pair import PairPanel
from attn_explorer.gui.analysis.atlas_view import HeadScatter
from attn_explorer.gui.analysis.common import AnalysisPage, EscCancelsJob
from attn_explorer.session.atlas import (EXAMPLE_KINDS, METRIC_HELP, METRICS, ROLE_THRESHOLDS, TOP_K, atlas_job,
                                         bundled_corpus, load_atlas_job, project_job, read_documents, save_atlas_job,
                                         suggest_roles, umap_available)
from attn_explorer.session.state import SessionState

BUILD, PROJECT, SAVE, OPEN = "atlas-build", "atlas-project", "atlas-save", "atlas-open"
DEFAULT_BUDGET = 5_000  # tokens: SmolLM2-135M read 3,000 in 93 s on a busy 2-core CPU
VIEWS = (("metrics", "two metrics"), ("pca", "PCA of the metrics"), ("umap", "UMAP of the metrics"))
CORPORA = (("bundled", "bundled corpus"), ("folder", "folder…"), ("files", "files…"))


class AtlasPage(EscCancelsJob, AnalysisPage):
    FOLLOWS_INPUT = False  # the corpus is its input: the text box's edits change nothing here

    def __init__(self, state: SessionState, parent=None):
        super().__init__(state, parent, mono_readout=False, again="Run again")
        self.unused_note(hide="every token of the corpus is measured; special tokens count as the sink",
                         log="the picture plots the heads' metrics, not weights")
        self.atlas = None  # the first atlas (analysis.atlas.Atlas), built here or opened
        self.atlas_docs = None  # the Documents it was built from (None: opened from a file)
        self.atlas_source = ""  # "built here" or "opened from x.npz"
        self.roles: dict = {}
        self.selected: tuple[int, int] | None = None
        self.documents = None  # the corpus of the next run as last read (session.atlas.Documents)
        self._paths: list[str] | None = None  # the folder or files chosen (None: the bundled corpus)
        self._projection = None  # (method, Projection) of the first atlas
        self.opener = ExampleOpener(self)
        self._budget_used = None  # the token budget of the run that made the atlas (None: opened)

        self.corpus_combo = QComboBox()
        for key, title in CORPORA:
            self.corpus_combo.addItem(title, key)
        self.corpus_combo.setToolTip("What the model reads: the corpus that ships with the app, a folder's .txt "
                                     "files, or text files you choose")
        self.per_line = QCheckBox("by line")
        self.per_line.setToolTip("On: each non-blank line is a document. Off: each file is one")
        self.budget = QSpinBox()
        self.budget.setRange(100, 2_000_000)
        self.budget.setSingleStep(5000)
        self.budget.setValue(DEFAULT_BUDGET)
        self.budget.setGroupSeparatorShown(True)
        self.budget.setSuffix(" tokens")
        self.budget.setToolTip("The run stops after this many tokens of the corpus")
        self.run_button = QPushButton("Run")
        self.save_button = QPushButton("Save atlas…")
        self.open_button = QPushButton("Open atlas…")
        self.open_button.setToolTip("An atlas .npz (saved here or by `python main.py atlas`): it opens without its model")
        for w in (self.corpus_combo, self.per_line, self.budget, self.run_button, self.save_button,
                  self.open_button):
            self.control_row.addWidget(w)
        self.control_row.addStretch(1)

        self.view_combo = QComboBox()
        for key, title in VIEWS:
            self.view_combo.addItem(title, key)
        if not umap_available():
            self.view_combo.model().item(2).setEnabled(False)
            self.view_combo.setItemData(2, "UMAP needs umap-learn (pip install umap-learn)", Qt.ToolTipRole)
        self.x_combo, self.y_combo = QComboBox(), QComboBox()
        for combo, first in ((self.x_combo, "prev_token"), (self.y_combo, "induction")):
            for name in METRICS:
                combo.addItem(name, name)
                combo.setItemData(combo.count() - 1, METRIC_HELP.get(name, ""), Qt.ToolTipRole)
            combo.setCurrentIndex(METRICS.index(first))
        self.kind_combo = QComboBox()
        for kind in EXAMPLE_KINDS:
            self.kind_combo.addItem(f"by {kind}", kind)
        self.kind_combo.setToolTip("The examples listed: a head's top pairs by weight, or its top rows by each "
                                   "metric's own score")
        for combo in (self.corpus_combo, self.view_combo, self.x_combo, self.y_combo, self.kind_combo):
            combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(8 if combo is self.corpus_combo else 6)
        row = QHBoxLayout()
        for w in (self.view_combo, QLabel("x"), self.x_combo, QLabel("y"), self.y_combo, QLabel("examples"),
                  self.kind_combo):
            row.addWidget(w)
        row.addStretch(1)
        self.add_row(row)

        self.scatter = HeadScatter(self.canvas, 0, 0, self.select_head)
        self.pair = PairPanel(self)  # the second atlas: its row of controls, its scatter, the match, same prompt
        self.side = ExamplePanel()
        self.side.roles.setText(roles_text(ROLE_THRESHOLDS))
        self.side.setMinimumWidth(220)
        self.add_side(self.side, (3, 1))

        self.run_button.clicked.connect(self.run)
        self.save_button.clicked.connect(self._save_dialog)
        self.open_button.clicked.connect(self._open_dialog)
        self.corpus_combo.activated.connect(self._corpus_chosen)
        self.per_line.toggled.connect(lambda *_: self._read_quietly())
        for combo in (self.view_combo, self.x_combo, self.y_combo):
            combo.currentIndexChanged.connect(lambda *_: self.redraw())
        self.kind_combo.currentIndexChanged.connect(lambda *_: self._show_side())
        self.side.example_chosen.connect(self.open_example)
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.model_loading.connect(self._model_loading)
        state.model_loaded.connect(self._model_loaded)
        self._set_enabled()
        self._prompt()
        self._read_quietly()

    # ---------------------------------------------------------------------------------- corpus
    def refresh(self, *_):
        """The atlas does not follow the text box."""

    def _prompt(self) -> None:
        self.stack.show_message("Choose a corpus and a token budget, then Run; or open a saved atlas.")

    def _corpus_chosen(self, *_) -> None:
        key = self.corpus_combo.currentData()
        if key == "folder":
            path = QFileDialog.getExistingDirectory(self, "A folder of .txt files")
            if path:
                self.set_corpus([path])
        elif key == "files":
            paths, _ = QFileDialog.getOpenFileNames(self, "Text files", "", "Text files (*.txt);;All files (*)")
            if paths:
                self.set_corpus(paths)
        else:
            self._paths = None
        self._read_quietly()

    def set_corpus(self, paths: list[str], per_line: bool | None = None) -> bool:
        """The corpus for the next run (a folder, or files); a bad one goes to the banner and the last good one
        stays."""
        if per_line is not None:
            with signals_blocked(self.per_line):
                self.per_line.setChecked(per_line)
        try:
            self.documents = read_documents(paths, self.per_line.isChecked())
        except UserError as e:
            self.state.error_raised.emit(str(e))
            return False
        self._paths = list(paths)
        folder = len(paths) == 1 and Path(paths[0]).is_dir()
        self.corpus_combo.setCurrentIndex(self.corpus_combo.findData("folder" if folder else "files"))
        self._update_caption()
        return True

    def current_documents(self):
        """The corpus the next run reads, read now: the chosen folder or files, else the bundled corpus."""
        if self._paths is not None:
            self.documents = read_documents(self._paths, self.per_line.isChecked())
        else:
            d = bundled_corpus()
            if d is None:
                raise UserError("this installation has no bundled corpus: choose a folder or text files")
            self.documents = read_documents([d], self.per_line.isChecked(), source="the bundled corpus")
        return self.documents

    def _read_quietly(self) -> None:
        """The caption's count of the next run's documents (a problem is said there, and again at Run)."""
        try:
            self.current_documents()
        except UserError:
            self.documents = None
        self._update_caption()

    # ---------------------------------------------------------------------------------- run
    def run(self) -> None:
        info = self.state.info
        if info is None:
            self.state.error_raised.emit("no model is loaded yet")
            return
        if info.modality != "text":
            self.state.error_raised.emit(f"{info.name} reads images; the atlas reads text")
            return
        try:
            docs = self.current_documents()
        except UserError as e:
            self.state.error_raised.emit(str(e))
            return
        self._forget()  # a new run: the old atlas's picture, examples and selection go now
        self.stack.show_message(f"Reading {len(docs):,} documents with {info.name}…")
        self.progress.start(f"Atlas of {info.name}", "%p%")
        self._set_enabled()
        started = self.state.submit(atlas_job, docs, TOP_K, int(self.budget.value()), key=BUILD,
                                    on_progress=self._progressed,
                                    on_result=lambda a, b=int(self.budget.value()): self._built(a, docs, b),
                                    on_error=self._failed_job)
        if not started:
            self._failed_job("no model is loaded yet")

    def _progressed(self, fraction: float, message: str) -> None:
        self.progress.advance(fraction, f"{self.progress.label.text().split(':')[0]}: {message}", say=True)

    def cancel(self) -> None:
        """Cancel (or Esc): the build in flight stops and nothing of it is kept."""
        for key in (BUILD, self.pair.BUILD):
            self.state.cancel(key)
        self.progress.stopped("Cancelled: nothing was kept.")
        self._set_enabled()
        if self.atlas is None:
            self.stack.show_message("Cancelled: nothing was kept. Run again to start over.")

    def restart(self) -> None:
        self.run()

    def resizeEvent(self, e) -> None:  # the two models side by side, or one under the other
        super().resizeEvent(e)
        if getattr(self, "pair", None) is not None:
            self.pair.arrange()

    def busy(self) -> bool:
        return self.state.job_busy(BUILD) or self.state.job_busy(self.pair.BUILD)

    def _failed_job(self, message: str) -> None:
        self.progress.finish()
        self._set_enabled()
        if self.atlas is None:
            self.stack.show_message("No atlas: the message at the top of the window says why.")
        self.state.error_raised.emit(message)

    def _built(self, atlas, docs, budget: int) -> None:
        self._atlas_arrived(atlas, docs, "built here")
        self._budget_used = budget
        self._update_caption()

    def _atlas_arrived(self, atlas, docs, source: str) -> None:
        self.progress.finish()
        if atlas is None:
            return
        self._forget()
        self.atlas, self.atlas_docs, self.atlas_source = atlas, docs, source
        self.roles = suggest_roles(atlas)
        self.side.roles.setText(roles_text(ROLE_THRESHOLDS, atlas, self.roles))
        self._set_enabled()
        self._update_caption()
        self.redraw()
        self.pair.first_changed()

    def _forget(self) -> None:
        """No atlas: its picture, examples, selection and match go (nothing stale stays on screen)."""
        self.atlas, self.atlas_docs, self.roles, self.selected, self._projection = None, None, {}, None, None
        self._budget_used = None
        self.side.roles.setText(roles_text(ROLE_THRESHOLDS))
        self.state.cancel(PROJECT)
        self.scatter.clear()
        self.side.clear()
        self.readout.setText("")
        self.pair.first_changed()
        self._update_caption()

    def _set_enabled(self) -> None:
        running = self.progress.running
        have = self.atlas is not None
        self.run_button.setEnabled(not running)
        self.open_button.setEnabled(not running)
        self.save_button.setEnabled(have and not running)
        for w in (self.view_combo, self.kind_combo):
            w.setEnabled(have)
        metrics = have and self.view_combo.currentData() == "metrics"
        self.x_combo.setEnabled(metrics)
        self.y_combo.setEnabled(metrics)
        self.pair.set_enabled(have and not running)

    # ---------------------------------------------------------------------------------- save / open
    def _save_dialog(self) -> None:
        if self.atlas is None:
            return
        path, _ = QFileDialog.getSaveFileName(self, "Save atlas", f"atlas-{Path(self.atlas.model).name}.npz",
                                              "Atlas (*.npz)")
        if path:
            self.save(path)

    def save(self, path: str) -> None:
        self.state.submit(save_atlas_job, self.atlas, path, key=SAVE, uses_model=False,
                          on_result=lambda p: self.readout.setText(f"Saved the atlas to {p}."),
                          on_error=self.state.error_raised.emit)

    def _open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open atlas", "", "Atlas (*.npz);;All files (*)")
        if path:
            self.open(path)

    def open(self, path: str) -> None:
        name = Path(path).name
        self.state.submit(load_atlas_job, path, key=OPEN, uses_model=False,
                          on_result=lambda a: self._atlas_arrived(a, None, f"opened from {name}"),
                          on_error=self.state.error_raised.emit)

    # ---------------------------------------------------------------------------------- picture
    def redraw(self) -> None:
        self._set_enabled()
        a = self.atlas
        if a is None:
            return
        view = self.view_combo.currentData()
        if view == "metrics":
            x, y = self.x_combo.currentData(), self.y_combo.currentData()
            xy = self.pair.metric_xy(a, x, y)
            self.scatter.show(xy, (a.n_layers, a.n_heads), x, y, self._title(a))
            self._drawn()
        elif self._projection is not None and self._projection[0] == view:
            self._show_projection(self._projection[1])
        else:
            self.scatter.clear(f"placing {a.n_layers * a.n_heads} heads…")
            self.state.submit(project_job, a, view, key=PROJECT, uses_model=False,
                              on_result=lambda p, a=a, v=view: self._projected(a, v, p),
                              on_error=self.state.error_raised.emit)
        self.pair.redraw()

    def _projected(self, atlas, view, p) -> None:
        if atlas is not self.atlas or self.view_combo.currentData() != view:
            return  # the choice moved on
        self._projection = (view, p)
        self._show_projection(p)

    def _show_projection(self, p) -> None:
        a = self.atlas
        ax = ((f"PCA 1 ({p.explained[0]:.0%} of the variance)", f"PCA 2 ({p.explained[1]:.0%})")
              if p.explained else ("UMAP 1", "UMAP 2"))
        self.scatter.show(p.xy, (a.n_layers, a.n_heads), *ax, self._title(a))
        self._drawn()
        self.readout.setText(f"{p.method.upper()} of each head's standardised metrics ({', '.join(p.metrics)}).")

    @staticmethod
    def _title(a) -> str:
        return f"{html.escape(Path(a.model).name)}: {a.n_layers} layers × {a.n_heads} heads"

    def _drawn(self) -> None:
        self.stack.show_canvas()
        self.pair.arrange()
        self.scatter.select(self.selected)
        self.pair.selection_changed()

    def _hovered(self, pos) -> None:
        for scatter, atlas in ((self.scatter, self.atlas), *self.pair.hover_targets()):
            hit = scatter.head_at(pos) if atlas is not None else None
            if hit is not None:
                first = (self.x_combo.currentData(), self.y_combo.currentData())
                self.readout.setText(hover_line(atlas, *hit, first=first))
                return

    # ---------------------------------------------------------------------------------- a head
    def select_head(self, layer: int, head: int) -> None:
        """Select a head of the first atlas: ring it, list its examples, light its match."""
        if self.atlas is None:
            return
        self.selected = (int(layer), int(head))
        self.scatter.select(self.selected)
        self._show_side()
        self.pair.selection_changed()

    def _show_side(self) -> None:
        if self.atlas is None or self.selected is None:
            self.side.clear()
            return
        l, h = self.selected
        exs = self.atlas.head_examples(l, h, self.kind_combo.currentData())
        self.side.show_head(self.atlas, l, h, self.roles.get((l, h), []), exs, self.pair.match_note())

    def open_example(self, index: int) -> None:
        """Open example `index` of the listed ones in the One-head view, its query selected (atlas_open)."""
        if self.atlas is not None and self.selected is not None and 0 <= index < len(self.side.examples):
            self.opener.open(self.atlas, self.selected, self.side.examples[index])

    # ---------------------------------------------------------------------------------- state
    def _model_loading(self, *_) -> None:
        """A model load stops the build on the old model (the runner drops its answer): say so, keep nothing."""
        if self.state.job_busy(BUILD):
            self.state.cancel(BUILD)
            self.progress.stopped("The model changed: the run was stopped and nothing was kept.")
            self._set_enabled()

    def _model_loaded(self, info) -> None:
        self._set_enabled()
        self._update_caption()

    def _update_caption(self) -> None:
        pair = getattr(self, "pair", None)
        self.caption.setText(atlas_caption(self.atlas, self.atlas_source, self.state.info, self.documents,
                                           self._paths is None, self._budget_used)
                             + (pair.caption_line() if pair is not None and self.atlas is not None else ""))
