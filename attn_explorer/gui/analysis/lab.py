"""The Lab page (issue 27 B): which heads are induction heads and which retrieve a needle, and a check of each.

Induction: Run scores every head on repeated random tokens (`session.lab.induction_job`, what `python main.py
induction` runs) and draws the L×H grid with the top heads listed; "Check by ablation" switches the top k
heads off, then k random heads (5 sets), and draws the loss on the repeat for each. Retrieval: haystacks of
the chosen lengths (capped by the model's positions) with the needle at the chosen depths; Run answers them
and draws the accuracy by (length, depth) and every head's retrieval score; its check compares needle
accuracy with the top k heads off against random sets. The needle, question and expected answer are fields
(checked before a run: a bad one is one banner line and the last result stays). Every run goes through the
session's worker with progress and Cancel (or Esc); a model switch or a new run clears what was shown.
Clicking a head (grid or list) selects it in the window; hovering an accuracy cell says its asked length,
the tokens its prompts had and its accuracy. "Save results…" writes the shown result and its check to one
.npz; "Open results…" shows one again without its model (lab_files).
"""
from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QLineEdit, QListWidget, QPushButton, QSpinBox,
                               QVBoxLayout, QWidget)

from attn_explorer.errors import UserError
from attn_explorer.gui.analysis.common import AnalysisPage, EscCancelsJob, untrained_tag
from attn_explorer.gui.analysis.lab_files import LabFiles
from attn_explorer.gui.analysis.lab_view import (BARS_MIN, GRID_MIN, TOP_LISTED, LabCanvas, cell_line, heads_text,
                                                 ranking_line, verdict_html)
from attn_explorer.session.lab import (DEFAULT_DEPTHS, Needle, default_lengths, field_text, induction_check_job,
                                       induction_job, parse_depths, parse_lengths, parse_needle, ranked_heads,
                                       retrieval_check_job, retrieval_job, top_for)
from attn_explorer.session.state import SessionState

JOB = "lab"  # one lane: a new run replaces the one in flight
MODES = (("induction", "Induction"), ("retrieval", "Retrieval"))
RANDOM_SETS = 5


class LabPage(EscCancelsJob, AnalysisPage):
    FOLLOWS_INPUT = False  # its inputs are made here (random tokens, haystacks), not the text box

    def __init__(self, state: SessionState, parent=None):
        # the canvas takes the height the tab has (at least this much), so at 1024×700 the check's chart is whole
        super().__init__(state, parent, mono_readout=False, again="Run again", fill_height=GRID_MIN + 40)
        self.unused_note(hide="every token counts", log="scores and accuracies are drawn on a plain scale")
        self.source = {"induction": "", "retrieval": ""}  # "opened from x.npz" for a result read from a file
        self.induction = None  # analysis.atlas_induction.InductionScores of the current model
        self.induction_check = None
        self.retrieval = None  # session.lab.RetrievalRun
        self.retrieval_check = None
        self._last = None  # what the running job does: ("induction" | "retrieval", "run" | "check")
        self._ranked: list = []  # the listed heads (layer, head, score)

        self.mode = QComboBox()
        for key, title in MODES:
            self.mode.addItem(title, key)
        self.lengths = QLineEdit("512,1024")
        self.lengths.setToolTip("Haystack lengths in tokens, comma-separated; at most the model's positions less "
                                "the answer's tokens")
        self.depths = QLineEdit(DEFAULT_DEPTHS)
        self.depths.setToolTip("Where the needle sits (the accuracy grid's columns): 0 first, 1 last (before the question), comma-separated")
        for e in (self.lengths, self.depths):
            e.setMinimumWidth(e.fontMetrics().horizontalAdvance("512,1024") + 12)
            e.setMaximumWidth(130)
        self.length_label, self.depth_label = QLabel("lengths"), QLabel("depths")
        self.top = QSpinBox()
        self.top.setRange(1, 64)
        self.top.setValue(5)
        self.top.setPrefix("top ")
        self.top.setToolTip("Heads switched off in the check (at most half the model's heads), against "
                            f"{RANDOM_SETS} random sets of as many")
        self.run_button = QPushButton("Run")
        self.check_button = QPushButton("Check by ablation")
        for w in (self.mode, self.length_label, self.lengths, self.depth_label, self.depths, self.run_button,
                  self.top, self.check_button):
            self.control_row.addWidget(w)
        self.control_row.addStretch(1)
        self._needle_row()
        self.files = LabFiles(self)

        self.view = LabCanvas(self.canvas, state.colormap)
        self.verdict = QLabel("")
        self.verdict.setWordWrap(True)
        self.verdict.setTextFormat(Qt.RichText)
        self.ranking_title = QLabel("")
        self.ranking = QListWidget()
        self.ranking.setToolTip("The heads ranked; click one to select it in the window")
        fm = self.ranking.fontMetrics()
        self.ranking.setMinimumWidth(fm.horizontalAdvance(ranking_line(11, 11, 1.0, "retrieval")) + 40)
        side = QWidget()
        lay = QVBoxLayout(side)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.ranking_title)
        lay.addWidget(self.ranking, 2)
        lay.addWidget(self.verdict, 1)
        side.setMaximumWidth(220)
        self.add_side(side)

        self.mode.currentIndexChanged.connect(lambda *_: self._mode_changed())
        self.run_button.clicked.connect(self.run)
        self.check_button.clicked.connect(self.check)
        self.ranking.itemClicked.connect(self._picked)
        self.ranking.itemActivated.connect(self._picked)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.model_loading.connect(self._model_loading)
        state.model_loaded.connect(self._model_loaded)
        if state.info is not None:
            self._model_loaded(state.info)
        self._mode_changed()

    def _needle_row(self) -> None:
        """The needle, the question and the expected answer (retrieval only), then Save results… / Open results…"""
        row = QHBoxLayout()
        self.needle_edit, self.question_edit, self.answer_edit = QLineEdit(), QLineEdit(), QLineEdit()
        self.needle_edit.setToolTip("The needle: the sentence hidden in the haystack, which holds the answer")
        self.question_edit.setToolTip("The question after the haystack; the model answers from its end. \\n is "
                                      "a line break")
        self.answer_edit.setToolTip("The expected answer: a case is right when the generated text holds it "
                                    "(ignoring case); it must be in the needle")
        self.needle_labels = [QLabel("needle"), QLabel("question"), QLabel("answer")]
        for label, e, stretch in zip(self.needle_labels, (self.needle_edit, self.question_edit, self.answer_edit),
                                     (3, 3, 1)):
            e.setMinimumWidth(60)
            row.addWidget(label)
            row.addWidget(e, stretch)
        self.needle = Needle()
        self.save_button = QPushButton("Save results…")
        self.save_button.setToolTip("The shown result (scores, ranked heads, accuracy grid, check, settings) as one .npz")
        self.open_button = QPushButton("Open results…")
        self.open_button.setToolTip("Results saved here or by `python main.py induction` / `retrieval`: they open "
                                    "without their model")
        row.addStretch(0)
        row.addWidget(self.save_button)
        row.addWidget(self.open_button)
        self.add_row(row)

    @property
    def needle(self) -> Needle:
        """The needle fields as they read now (unchecked; `run` checks them)."""
        return Needle(*(e.text().replace("\\n", "\n") for e in (self.needle_edit, self.question_edit,
                                                                 self.answer_edit)))

    @needle.setter
    def needle(self, n: Needle) -> None:
        for e, text in zip((self.needle_edit, self.question_edit, self.answer_edit), (n.needle, n.question, n.answer)):
            e.setText(field_text(text))
            e.setCursorPosition(0)

    # ---------------------------------------------------------------------------------- state
    def refresh(self, *_):
        """The lab does not follow the text box."""

    def current_mode(self) -> str:
        return self.mode.currentData()

    def set_mode(self, key: str) -> None:
        self.mode.setCurrentIndex(self.mode.findData(key))

    def _mode_changed(self) -> None:
        retrieval = self.current_mode() == "retrieval"
        for w in (self.length_label, self.lengths, self.depth_label, self.depths, self.needle_edit,
                  self.question_edit, self.answer_edit, *self.needle_labels):
            w.setVisible(retrieval)
        self.redraw()

    def _model_loading(self, *_) -> None:
        """A new model: the job on the old one stops and every result of it goes."""
        if self.progress.running:
            self.state.cancel(JOB)
            self.progress.stopped("The model changed: the run was stopped and nothing was kept.")
        self._forget("induction")
        self._forget("retrieval")
        self.redraw()

    def _model_loaded(self, info) -> None:
        self.lengths.setText(default_lengths(info))
        self.top.setMaximum(top_for(info, 64))
        self._set_enabled()
        self.redraw()

    def _forget(self, mode: str) -> None:
        if mode == "induction":
            self.induction, self.induction_check = None, None
        else:
            self.retrieval, self.retrieval_check = None, None
        self.source[mode] = ""

    def _set_enabled(self) -> None:
        running = self.progress.running
        have = (self.induction if self.current_mode() == "induction" else self.retrieval) is not None
        self.run_button.setEnabled(not running and self.state.info is not None)
        self.check_button.setEnabled(not running and have)
        self.mode.setEnabled(not running)
        self.save_button.setEnabled(not running and have)
        self.open_button.setEnabled(not running)

    # ---------------------------------------------------------------------------------- jobs
    def run(self) -> None:
        info = self.state.info
        if info is None:
            self.state.error_raised.emit("no model is loaded yet")
            return
        mode = self.current_mode()
        if mode == "induction":
            args, title = (), f"Induction scores of {info.name}"
            fn, done = induction_job, self._induction_arrived
        else:
            try:
                lengths, depths = parse_lengths(self.lengths.text(), info), parse_depths(self.depths.text())
                needle = parse_needle(self.needle_edit.text(), self.question_edit.text(), self.answer_edit.text())
            except UserError as e:
                self.state.error_raised.emit(str(e))  # the last result stays
                return
            args, title = (lengths, depths, needle), f"Needles in haystacks for {info.name}"
            fn, done = retrieval_job, self._retrieval_arrived
        self._forget(mode)  # a new run: the old result and its check go now
        self._start(title, (mode, "run"), fn, args, done)

    def check(self) -> None:
        mode = self.current_mode()
        info = self.state.info
        if info is None:
            return
        k = top_for(info, self.top.value())
        shown = self.induction if mode == "induction" else self.retrieval
        made_by = getattr(shown, "model", None) or getattr(getattr(shown, "result", None), "model", None)
        if made_by is not None and made_by != info.name:
            self.state.error_raised.emit(f"these results are {made_by}'s; the loaded model is {info.name}: load "
                                         f"{made_by} to check them")
            return
        if mode == "induction" and self.induction is not None:
            fn, args = induction_check_job, (self.induction.scores, k, RANDOM_SETS)
        elif mode == "retrieval" and self.retrieval is not None:
            fn, args = retrieval_check_job, (self.retrieval, k, RANDOM_SETS)
        else:
            return
        self._set_check(mode, None)
        self._start(f"Check of {info.name}: top {k} heads off, then {RANDOM_SETS} random sets of {k}",
                    (mode, "check"), fn, args, lambda c, m=mode: self._check_arrived(m, c))

    def _start(self, title: str, what, fn, args, done) -> None:
        self._last = what
        self.redraw()
        if what[1] == "run":
            self.stack.show_message(f"{title}…")
        self.progress.start(title, "%p%")
        self._set_enabled()
        name = self.state.info.name
        started = self.state.submit(fn, *args, key=JOB, on_progress=self._progressed,
                                    on_result=lambda r: self._arrived(name, done, r), on_error=self._failed_job)
        if not started:
            self._failed_job("no model is loaded yet")

    def _progressed(self, fraction: float, message: str) -> None:
        self.progress.advance(fraction, f"{self.progress.label.text().split(':')[0]}: {message}", say=True)

    def _arrived(self, name: str, done, result) -> None:
        self.progress.finish()
        self._set_enabled()
        if self.state.info is None or self.state.info.name != name:
            return  # made by a model that is gone
        done(result)

    def _induction_arrived(self, scores) -> None:
        self.induction, self.induction_check = scores, None
        self.set_mode("induction")
        self.redraw()

    def _retrieval_arrived(self, run) -> None:
        self.retrieval, self.retrieval_check = run, None
        self.set_mode("retrieval")
        self.redraw()

    def _set_check(self, mode: str, check) -> None:
        if mode == "induction":
            self.induction_check = check
        else:
            self.retrieval_check = check

    def _check_arrived(self, mode: str, check) -> None:
        self._set_check(mode, check)
        self.redraw()

    def cancel(self) -> None:
        """Cancel (or Esc): the job stops and nothing of it is kept."""
        self.state.cancel(JOB)
        self.progress.stopped("Cancelled: nothing was kept.")
        self._set_enabled()
        self.redraw()

    def restart(self) -> None:
        if self._last is not None and self._last[1] == "check":
            self.set_mode(self._last[0])
            self.check()
        else:
            self.run()

    def busy(self) -> bool:
        return self.state.job_busy(JOB)

    def _failed_job(self, message: str) -> None:
        self.progress.finish()
        self._set_enabled()
        self.redraw()
        self.state.error_raised.emit(message)

    # ---------------------------------------------------------------------------------- drawing
    def redraw(self) -> None:
        self._set_enabled()
        info = self.state.info
        mode = self.current_mode()
        scores = self.induction if mode == "induction" else self.retrieval
        check = self.induction_check if mode == "induction" else self.retrieval_check
        self.ranking.clear()
        self.verdict.setText("")
        self.readout.setText("")
        if scores is None:
            self.view.clear()
            self._ranked = []
            self.ranking_title.setText("")
            self.caption.setText(self._intro(info))
            self.stack.setMinimumHeight(GRID_MIN + 40)
            if not self.progress.running:
                self.stack.show_message("Press Run." if info is not None else "Loading the model…")
            return
        self.stack.show_canvas()
        self.stack.setMinimumHeight(GRID_MIN + 40 + (BARS_MIN + 20 if check is not None else 0))
        made_by = scores.model if mode == "induction" else scores.result.model
        name = html.escape(made_by)
        if mode == "induction":
            self.view.show_induction(scores.scores, check, made_by)
            ranked = [(l, h, float(scores.scores[l, h])) for l, h in ranked_heads(scores.scores)]
            what = "induction"
            cap = (f"<b>Induction heads of {name}</b>: each head's mean weight from a repeated token to the token "
                   f"after its first copy, over {scores.batches} random sequences of {scores.seq_len} tokens "
                   f"repeated once. Top: {heads_text([r[:2] for r in ranked[:3]])}.")
        else:
            r = scores.result
            self.view.show_retrieval(r, check, made_by)
            ranked = r.ranked() if r.copied else []
            what = "retrieval"
            found = (f"Top: {heads_text([x[:2] for x in ranked[:3]])}." if ranked else
                     "<b>No answer token was copied from the needle</b>: no head has a retrieval score.")
            cap = (f"<b>Retrieval heads of {name}</b>: {len(scores.cases) or len(r.answers)} haystacks; a head's score is the share "
                   f"of answer tokens copied from the needle that it attended to most (Wu et al. 2024), over "
                   f"{r.copied} copied tokens. Needle accuracy (grid: rows lengths, columns depths; hover a cell "
                   f"for its prompts' actual tokens) {float(np.nanmean(r.accuracy)):.0%} on average. {found}")
        self.caption.setText(cap + self.files.source_note(mode, made_by))
        self.ranking_title.setText(f"top {min(TOP_LISTED, len(ranked))} heads by {what} score" if ranked else "")
        for l, h, v in ranked[:TOP_LISTED]:
            self.ranking.addItem(ranking_line(l, h, v, what))
        self._ranked = ranked[:TOP_LISTED]
        if check is not None:
            self.verdict.setText(verdict_html(check, what))
        elif not self.progress.running:
            self.verdict.setText("“Check by ablation” switches the top heads off, then as many random heads.")

    def _intro(self, info) -> str:
        if info is None:
            return ""
        if self.current_mode() == "induction":
            text = (f"<b>Induction heads of {html.escape(info.name)}</b>: Run scores every head on repeated random "
                    "tokens; the check then switches the top heads off against random ones.")
        else:
            text = (f"<b>Retrieval heads of {html.escape(info.name)}</b>: a needle sentence at each depth of filler "
                    f"cut to each length (at most {info.max_positions:,} positions), then a question; the model "
                    "answers greedily.")
        return text + untrained_tag(info)

    # ---------------------------------------------------------------------------------- a head
    def _clicked(self, ev) -> None:
        hit = self.view.head_at(ev.scenePos())
        if hit:
            self.open_head(*hit)

    def _hovered(self, pos) -> None:
        hit = self.view.head_at(pos)
        if hit:
            v = float(self.view.heads[hit])
            self.readout.setText(f"L{hit[0]} H{hit[1]}: {self.current_mode()} score {v:.3f}")
            self.canvas.setToolTip("")
            return
        cell = self.view.cell_at(pos)
        if cell is not None and self.view.result is not None:
            line = cell_line(self.view.result, *cell)
            self.readout.setText(line)
            self.canvas.setToolTip(line)
        else:
            self.canvas.setToolTip("")

    # ---------------------------------------------------------------------------------- files
    def save(self, path: str) -> None:
        self.files.save(path)

    def open(self, path: str) -> None:
        self.files.open(path)

    def _picked(self, item) -> None:
        row = self.ranking.row(item)
        if 0 <= row < len(self._ranked):
            l, h, _ = self._ranked[row]
            self.open_head(l, h)
