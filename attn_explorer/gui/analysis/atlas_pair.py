"""The Atlas page's second model (issue 27 C): a second atlas of the same corpus (another model, run here in its
own job, or an opened .npz), its heads matched to the first's (the Hungarian assignment on their standardised
metric vectors), its scatter beside the first, the two linked (selecting a head on either side rings its match
on the other, the similarity said), and "same prompt, two models": the matched heads' maps for one short prompt
side by side.

The session holds one model; the second is loaded inside its own job by the session's loader and kept in a
`SecondModel` (session.atlas), so both are in memory while this page uses them. A second atlas opened from a
file has no model: its side of the prompt shows its head's top example instead, and says so in one line.
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPushButton

from attn_explorer.gui.analysis.atlas_examples import snippet_html
from attn_explorer.gui.analysis.atlas_view import HeadScatter, set_title
from attn_explorer.gui.analysis.common import HeatPanel, peak
from attn_explorer.session.atlas import (TOP_K, SecondModel, load_atlas_job, match_job, project_job, prompt_map_job,
                                         second_atlas_job, second_prompt_map_job)

MATCH, OPEN_B, PROJECT_B, PROMPT_A, PROMPT_B = ("atlas-match", "atlas-open-b", "atlas-project-b", "atlas-prompt-a",
                                                "atlas-prompt-b")
SAMPLE_PROMPT = "The cat sat on the mat. The cat sat on the"
WIDE = 760  # canvas pixels from which the two models sit side by side; narrower, one under the other
ROW_PX = 260  # each row of plots at least this tall when stacked (the page then scrolls)


class PairPanel(QObject):
    """The second atlas of an `AtlasPage` (`page`): its controls row, scatter, match and prompt maps."""

    BUILD = "atlas-build-b"

    def __init__(self, page):
        super().__init__(page)
        self.page, self.state = page, page.state
        self.atlas = None  # the second atlas
        self.source = ""  # "built here" or "opened from b.npz"
        self.holder = SecondModel()  # the second model, when it was run here
        self.pairs: list = []  # [(la, ha, lb, hb, similarity)]
        self.a2b: dict = {}
        self.b2a: dict = {}
        self.selected_b: tuple[int, int] | None = None  # a head clicked on the second scatter
        self.scatter: HeadScatter | None = None  # made with the first second atlas
        self.heat: tuple[HeatPanel, HeatPanel] | None = None  # made with the first prompt
        self._projection = None
        self._title = ""
        self._arranged = None  # (columns, blocks) the canvas is laid out for

        self.model_edit = QLineEdit()
        self.model_edit.setPlaceholderText("second model: built-in name, folder or hub id")
        self.model_edit.setToolTip("Its atlas is built on the same corpus and budget, in its own job, and its heads "
                                   "are matched to the first atlas's")
        self.run_button = QPushButton("Run second")
        self.open_button = QPushButton("Open second…")
        self.open_button.setToolTip("A second atlas .npz (without its model: its prompt maps are not run)")
        self.prompt_edit = QLineEdit(SAMPLE_PROMPT)
        self.prompt_edit.setToolTip("A short prompt (its first 64 tokens) run through both models: the selected "
                                    "head's map and its match's, side by side")
        self.prompt_button = QPushButton("Same prompt")
        self.prompt_note = QLabel("")
        self.prompt_note.setWordWrap(True)
        self.prompt_note.setTextFormat(Qt.RichText)
        self.prompt_note.hide()
        row = QHBoxLayout()
        for w in (self.model_edit, self.run_button, self.open_button, self.prompt_edit, self.prompt_button):
            row.addWidget(w)
        for w in (self.model_edit, self.prompt_edit):
            w.setMinimumWidth(80)
        row.setStretch(0, 2)
        row.setStretch(3, 3)
        page.add_row(row)
        page.add_row(self.prompt_note)
        self.run_button.clicked.connect(self.run)
        self.model_edit.returnPressed.connect(self.run)
        self.open_button.clicked.connect(self._open_dialog)
        self.prompt_button.clicked.connect(self.show_prompt)
        self.prompt_edit.returnPressed.connect(self.show_prompt)

    # ------------------------------------------------------------------------------------- layout
    def arrange(self, force: bool = False) -> None:
        """The plots in the canvas: the first scatter, the second (when there is a second atlas), then the two
        prompt maps (once asked for); two columns when the canvas is wide enough, else one (taller, scrolled)."""
        page = self.page
        blocks = [page.scatter] + ([self.scatter] if self.scatter is not None and self.atlas is not None else [])
        maps = list(self.heat) if self.heat is not None and self.atlas is not None else []
        cols = 2 if page.canvas.width() >= WIDE or len(blocks) + len(maps) == 1 else 1
        key = (cols, len(blocks), len(maps))
        if key == self._arranged and not force:
            return
        self._arranged = key
        ci = page.canvas.ci
        every = [page.scatter] + ([self.scatter] if self.scatter is not None else [])
        for item in [i for b in every for i in (b.plot, b.bar)] + [p.plot for p in (self.heat or ())]:
            if item in ci.items:
                ci.removeItem(item)
        for n, b in enumerate(blocks):
            r, c = (0, 2 * n) if cols == 2 else (n, 0)
            ci.addItem(b.plot, r, c)
            ci.addItem(b.bar, r, c + 1)
        first = 1 if cols == 2 else len(blocks)
        for n, p in enumerate(maps):
            r, c = (first, 2 * n) if cols == 2 else (first + n, 0)
            ci.addItem(p.plot, r, c, 1, 2)
        rows = (1 + (1 if maps else 0)) if cols == 2 else len(blocks) + len(maps)
        page.stack.setMinimumHeight(ROW_PX * rows if rows > 1 else 0)

    # ------------------------------------------------------------------------------------- second atlas
    def set_enabled(self, on: bool) -> None:
        for w in (self.model_edit, self.run_button, self.open_button):
            w.setEnabled(on)
        self.prompt_button.setEnabled(on and self.atlas is not None)

    def run(self) -> None:
        src = self.model_edit.text().strip()
        if not src:
            self.state.error_raised.emit("type the second model's name (a built-in, a folder or a hub id)")
            return
        if self.page.atlas is None or self.page.atlas_docs is None:
            self.state.error_raised.emit("run the first atlas here first: the second reads the same corpus")
            return
        docs, budget = self.page.atlas_docs, int(self.page.budget.value())
        self._forget()
        self.page.progress.start(f"Atlas of {src}", "%p%")
        self.page._set_enabled()
        host = self.state.host
        self.state.submit(second_atlas_job, self.holder, host.loader, src, host.device, docs, TOP_K,
                          budget, key=self.BUILD, uses_model=False, on_progress=self.page._progressed,
                          on_result=lambda b: self._arrived(b, "built here"), on_error=self.page._failed_job)

    def _open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.page, "Open second atlas", "", "Atlas (*.npz);;All files (*)")
        if path:
            self.open(path)

    def open(self, path: str) -> None:
        name = Path(path).name
        self.state.submit(load_atlas_job, path, key=OPEN_B, uses_model=False,
                          on_result=lambda b: self._arrived(b, f"opened from {name}"),
                          on_error=self.state.error_raised.emit)

    def _arrived(self, atlas, source: str) -> None:
        self.page.progress.finish()
        if atlas is None:
            return
        self._forget()
        self.atlas, self.source = atlas, source
        if not source.startswith("built"):
            self.holder.model = None  # an opened atlas has no model here: the prompt must not run the last one
        if self.scatter is None:
            self.scatter = HeadScatter(self.page.canvas, 20, 0, self.select_b)  # a free cell; arrange() places it
        self.arrange()
        self.page._set_enabled()
        self.page._update_caption()
        self.redraw()
        self._match()

    def _forget(self) -> None:
        self.atlas, self.pairs, self.a2b, self.b2a, self.selected_b, self._projection = None, [], {}, {}, None, None
        for key in (MATCH, PROJECT_B, PROMPT_B):
            self.state.cancel(key)
        if self.scatter is not None:
            self.scatter.clear()
        self._clear_prompt()
        self.arrange()
        self.page._update_caption()

    def first_changed(self) -> None:
        """The first atlas changed (a new run, an opened file, or none): the match is redone or goes."""
        self.pairs, self.a2b, self.b2a, self.selected_b = [], {}, {}, None
        self.state.cancel(MATCH)
        self._clear_prompt()
        if self.scatter is not None:
            self.scatter.select(None)
            self.scatter.mark_match(None)
        self._match()

    def _match(self) -> None:
        a, b = self.page.atlas, self.atlas
        if a is None or b is None:
            return
        self.state.submit(match_job, a, b, key=MATCH, uses_model=False,
                          on_result=lambda p, a=a, b=b: self._matched(a, b, p), on_error=self.state.error_raised.emit)

    def _matched(self, a, b, pairs) -> None:
        if a is not self.page.atlas or b is not self.atlas:
            return
        self.pairs = pairs
        self.page._update_caption()
        self.a2b = {(la, ha): (lb, hb, s) for la, ha, lb, hb, s in pairs}
        self.b2a = {(lb, hb): (la, ha, s) for la, ha, lb, hb, s in pairs}
        self.selection_changed()
        self.page._show_side()

    # ------------------------------------------------------------------------------------- picture
    @staticmethod
    def metric_xy(atlas, x: str, y: str) -> np.ndarray:
        nan = np.full((atlas.n_layers, atlas.n_heads), np.nan)
        return np.stack([atlas.metrics.get(x, nan).ravel(), atlas.metrics.get(y, nan).ravel()], axis=1)

    def redraw(self) -> None:
        b, page = self.atlas, self.page
        if b is None or self.scatter is None:
            return
        view = page.view_combo.currentData()
        title = self._title = f"{html.escape(Path(b.model).name)}: {b.n_layers} × {b.n_heads}"
        if view == "metrics":
            x, y = page.x_combo.currentData(), page.y_combo.currentData()
            self.scatter.show(self.metric_xy(b, x, y), (b.n_layers, b.n_heads), x, y, title)
        elif self._projection is not None and self._projection[0] == view:
            p = self._projection[1]
            self.scatter.show(p.xy, (b.n_layers, b.n_heads), f"{p.method.upper()} 1", f"{p.method.upper()} 2", title)
        else:
            self.scatter.clear("placing its heads…")
            self.state.submit(project_job, b, view, key=PROJECT_B, uses_model=False,
                              on_result=lambda p, b=b, v=view: self._projected(b, v, p),
                              on_error=self.state.error_raised.emit)
            return
        self.selection_changed()

    def _projected(self, b, view, p) -> None:
        if b is self.atlas and self.page.view_combo.currentData() == view:
            self._projection = (view, p)
            self.redraw()

    def caption_line(self) -> str:
        """The second atlas in words, for the page's caption ("" without one)."""
        b = self.atlas
        if b is None:
            return ""
        return (f" Second atlas: <b>{html.escape(b.model)}</b>, {b.tokens:,} tokens, {html.escape(self.source)}; "
                f"{len(self.pairs)} heads matched.")

    def hover_targets(self) -> list:
        return [(self.scatter, self.atlas)] if self.scatter is not None and self.atlas is not None else []

    # ------------------------------------------------------------------------------------- linked selection
    def select_b(self, layer: int, head: int) -> None:
        """A head clicked on the second scatter: its match on the first is selected (and listed)."""
        if self.atlas is None:
            return
        m = self.b2a.get((layer, head))
        if m is None or self.page.atlas is None:
            self.selected_b = (layer, head)
            self.scatter.select(self.selected_b)
            self.page.readout.setText(f"{self.atlas.model} L{layer} H{head}: no match (the match is not ready, or "
                                      "the other model has fewer heads)")
            return
        self.selected_b = None
        self.page.select_head(m[0], m[1])

    def selection_changed(self) -> None:
        """Ring the match of the first atlas's selected head here (dashed orange), the similarity in the read-out
        and the title; the prompt maps follow the pair."""
        a_sel = self.page.selected
        if self.scatter is None:
            return
        plot = self.scatter.plot
        if a_sel is not None and a_sel in self.a2b:
            lb, hb, s = self.a2b[a_sel]
            self.scatter.select(None)
            self.scatter.mark_match((lb, hb))
            self.page.readout.setText(f"{self.page.atlas.model} L{a_sel[0]} H{a_sel[1]} ↔ {self.atlas.model} "
                                      f"L{lb} H{hb}: similarity {s:.2f} (cosine of the standardised metrics)")
            set_title(plot, f"{self._title}<br>L{lb} H{hb} ↔ L{a_sel[0]} H{a_sel[1]}, similarity {s:.2f}")
            if self.heat is not None and self.prompt_edit.text().strip():
                self.show_prompt()  # the maps follow the selected pair
        else:
            self.scatter.mark_match(None)
            self.scatter.select(self.selected_b)
            if self.atlas is not None:
                set_title(plot, self._title)

    def match_note(self) -> str:
        sel = self.page.selected
        if self.atlas is None or sel is None:
            return ""
        if sel not in self.a2b:
            return f"no match in {self.atlas.model} yet" if not self.pairs else f"no partner in {self.atlas.model}"
        lb, hb, s = self.a2b[sel]
        return f"matched to {self.atlas.model} L{lb} H{hb}, similarity {s:.2f}"

    # ------------------------------------------------------------------------------------- same prompt
    def show_prompt(self) -> None:
        a_sel = self.page.selected
        text = self.prompt_edit.text()
        if self.atlas is None or a_sel is None or a_sel not in self.a2b:
            self.state.error_raised.emit("select a head of the first atlas that has a match in the second first")
            return
        lb, hb, _ = self.a2b[a_sel]
        if self.heat is None:
            self.heat = (HeatPanel(self.page.canvas, 21, 0, "viridis"), HeatPanel(self.page.canvas, 22, 0, "viridis"))
        self.arrange()
        self._clear_prompt(keep_panels=True)
        if self.state.info is None or self.state.info.name != self.page.atlas.model:
            self.prompt_note.setText(f"The loaded model is not {html.escape(self.page.atlas.model)}: load it to run "
                                     "the first map.")
            self.prompt_note.show()
        else:
            self.state.submit(prompt_map_job, text, *a_sel, key=PROMPT_A, on_result=lambda m: self._map(0, m),
                              on_error=self.state.error_raised.emit)
        if self.holder.model is not None and self.source.startswith("built"):
            self.state.submit(second_prompt_map_job, self.holder, text, lb, hb, key=PROMPT_B, uses_model=False,
                              on_result=lambda m: self._map(1, m), on_error=self.state.error_raised.emit)
            return
        ex = self.atlas.head_examples(lb, hb, "weight")
        self.prompt_note.setText(
            f"The second atlas was {html.escape(self.source)} without its model, so its map of the prompt is not run; "
            f"its L{lb} H{hb}'s top example instead: " + (snippet_html(ex[0].tokens, ex[0].query_at, ex[0].key_at)
                                                          if ex else "none kept"))
        self.prompt_note.show()
        set_title(self.heat[1].plot, f"{html.escape(self.atlas.model)} L{lb} H{hb}: no model here (see the line above)")

    def _map(self, side: int, m) -> None:
        if self.heat is None:
            return
        panel = self.heat[side]
        panel.show(m.weights, m.tokens, m.tokens, (0.0, peak(m.weights)), "viridis",
                   label="weight")
        set_title(panel.plot, f"{html.escape(Path(m.model).name)} L{m.layer} H{m.head}, {len(m.tokens)} tokens")

    def _clear_prompt(self, keep_panels: bool = False) -> None:
        for key in (PROMPT_A, PROMPT_B):
            self.state.cancel(key)
        self.prompt_note.hide()
        self.prompt_note.setText("")
        if self.heat is not None:
            for p in self.heat:
                p.image.clear()
                p.matrix = None
                set_title(p.plot, "" if keep_panels else "press Same prompt for the selected pair's maps")
