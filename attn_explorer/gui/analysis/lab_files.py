"""The Lab page's results files: "Save results…" writes the shown result (induction or retrieval) with its check
and settings to one .npz through the session's worker (session.lab.save_results_job, atomic); "Open results…"
reads one (saved here, or by `python main.py induction` / `retrieval`) and shows it without its model, as the
Atlas page opens an atlas. A bad file is one banner line and what was shown stays.
"""
from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from attn_explorer.gui.analysis.common import untrained_tag
from attn_explorer.session.lab import open_results_job, save_results_job

SAVE, OPEN = "lab-save", "lab-open"


class LabFiles:
    """Save and open for one `LabPage` (`page`)."""

    def __init__(self, page):
        self.page, self.state = page, page.state
        page.save_button.clicked.connect(self._save_dialog)
        page.open_button.clicked.connect(self._open_dialog)

    def _shown(self):
        p = self.page
        if p.current_mode() == "induction":
            return p.induction, p.induction_check
        return p.retrieval, p.retrieval_check

    def _save_dialog(self) -> None:
        result, _ = self._shown()
        if result is None:
            return
        model = result.model if hasattr(result, "model") else result.result.model
        path, _ = QFileDialog.getSaveFileName(self.page, "Save lab results",
                                              f"lab-{self.page.current_mode()}-{Path(model).name}.npz",
                                              "Lab results (*.npz)")
        if path:
            self.save(path)

    def save(self, path: str) -> None:
        result, check = self._shown()
        if result is None:
            self.state.error_raised.emit("nothing to save: run the lab first")
            return
        self.state.submit(save_results_job, result, check, path, key=SAVE, uses_model=False,
                          on_result=lambda p: self.page.readout.setText(f"Saved the results to {p}."),
                          on_error=self.state.error_raised.emit)

    def _open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.page, "Open lab results", "",
                                              "Lab results (*.npz);;All files (*)")
        if path:
            self.open(path)

    def open(self, path: str) -> None:
        name = Path(path).name
        self.state.submit(open_results_job, path, key=OPEN, uses_model=False,
                          on_result=lambda got: self._opened(got, name), on_error=self.state.error_raised.emit)

    def _opened(self, got, name: str) -> None:
        kind, result, check = got
        p = self.page
        if p.progress.running and p._last is not None and p._last[0] == kind:
            p.cancel()  # the run in flight would replace what was opened
        if kind == "induction":
            p.induction, p.induction_check = result, check
        else:
            p.retrieval, p.retrieval_check = result, check
            if result.filler:  # the fields show what it was made with, where the file says
                p.needle = result.needle
        p.source[kind] = f"opened from {name}"
        p.set_mode(kind)
        p.redraw()

    def source_note(self, mode: str, made_by: str) -> str:
        """The caption's end: where an opened result came from and whether the loaded model can check it; for a
        result made here, whether the model is untrained."""
        info = self.state.info
        source = self.page.source.get(mode, "")
        if not source:
            return untrained_tag(info)
        other = ("" if info is not None and info.name == made_by else
                 f" The loaded model is {html.escape(info.name) if info else 'none'}: checking these results needs "
                 f"{html.escape(made_by)}.")
        return f" <i>{html.escape(source)}.</i>{other}"
