"""File → Save session… / Open session… / Open saved run…: the window's side of sessions and saved runs.

`SessionActions(window, state)` is held by the window (`window.session_actions`). A session (.axsession, see
session/saved.py) brings back the model, input, sliders, selection, page and options; a saved run (.npz,
session/reopen.py) shows its maps without the model, under a line that says so, with the controls that
would run the model switched off until a model is chosen. Every problem is one line in the banner and
the last good view stays.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QLabel
from superqt.utils import signals_blocked

from attn_explorer.errors import UserError
from attn_explorer.gui.explorer.controls import slider_from_dk
from attn_explorer.gui.widgets.heatmap import COLORMAPS
from attn_explorer.gui.window.menus import add_action
from attn_explorer.session.reopen import SavedRun, read_run
from attn_explorer.session.saved import SUFFIX, read_session, snapshot, view_options, write_session

SESSION_FILTER = f"attn-explorer session (*{SUFFIX});;All files (*)"
RUN_FILTER = "Saved run (*.npz);;All files (*)"


def saved_view(state, page: str) -> dict:
    """What an exported .npz records of the view: page, selection, options, and the text."""
    view = {**view_options(state), "page": page, "layer": int(state.layer), "head": int(state.head),
            "query": int(state.query), "query_chosen": bool(state._query_chosen)}
    if state.input_kind == "text":
        view["text"] = str(state.text)
    return view


class SessionActions:
    """Sessions and saved runs of `window` (a MainWindow: settings, pages, banner, panels, toolbar, status
    labels, show_page, show_error, current_page_name)."""

    def __init__(self, window, state) -> None:
        self.window, self.state = window, state
        self.saved_run_line = QLabel("")
        self.saved_run_line.setObjectName("saved-run-line")
        self.saved_run_line.setWordWrap(True)
        self.saved_run_line.setStyleSheet("#saved-run-line { background: #e8f0fb; border: 1px solid #b9cdea; "
                                          "border-radius: 4px; padding: 3px 8px; color: #1d3f72; }")
        self.saved_run_line.hide()
        lay = window.centralWidget().layout()
        lay.insertWidget(lay.indexOf(window.banner) + 1, self.saved_run_line)
        st = self.state
        st.saved_run_shown.connect(self._saved_run_shown)
        st.model_loaded.connect(lambda _info: self._saved_run_mode(bool(st.result_only)))
        self.session_page = ""  # the page of a session whose model is loading
        st.model_loaded.connect(lambda _info: self._session_model_loaded())
        st.attention_ready.connect(lambda _r: self._follow_sliders())

    def build_menu(self, file_menu) -> None:
        """The File menu's session entries."""
        w = self.window
        self.act_open_session = add_action(w, file_menu, "Open &session…", self.open_session_dialog, "Ctrl+O")
        self.act_save_session = add_action(w, file_menu, "Sa&ve session…", self.save_session_dialog, "Ctrl+S")
        self.act_open_run = add_action(w, file_menu, "Open saved &run (.npz)…", self.open_run_dialog, "Ctrl+Shift+R")

    # ------------------------------------------------------------------------------- sessions
    def save_session(self, path: str) -> Path:
        """Write the session on screen to `path` (.axsession added when it has no suffix)."""
        p = Path(path)
        if not p.suffix:
            p = p.with_suffix(SUFFIX)
        try:
            out = write_session(snapshot(self.state, self.window.current_page_name), p)
        except UserError as e:
            self.window.show_error(str(e))
            raise
        self.window.settings.setValue("paths/last_folder", str(p.parent))
        self.window.statusBar().showMessage(f"saved session {out}", 5000)
        return out

    def open_session(self, path: str) -> bool:
        """Open session file `path`: its model, input, sliders, selection, page and options. A bad file
        or a missing image or model is one line in the banner, and nothing changes."""
        try:
            s = read_session(path)
            loads = self.state.open_session(self.known_colormap(s))
        except UserError as e:
            self.window.show_error(str(e))
            return False
        self.window.settings.setValue("paths/last_folder", str(Path(path).parent))
        self.window.statusBar().showMessage(f"opened session {Path(path).name}" + (": loading its model…" if loads else ""),
                                     5000)
        if s.page in self.window.pages and loads:
            self.session_page = s.page  # shown when its model has loaded: a failed load changes nothing
        elif s.page in self.window.pages:
            self.window.show_page(s.page)
        elif s.page:
            self.window.show_error(f"the session's page {s.page!r} does not exist in this version: showing "
                            f"{self.window.current_page_name!r}")
        return True

    def _session_model_loaded(self) -> None:
        """A model loaded: if it is the session's (its restore comes next), show the session's page, pinned so
        that the window's own page choice for the model keeps it."""
        page, self.session_page = self.session_page, ""
        if page and self.state._session is not None:
            self.window.show_page(page, pin=True)

    @staticmethod
    def known_colormap(s):
        if s.view.get("colormap") not in COLORMAPS:
            s.view.pop("colormap", None)  # a colormap of another version: the window keeps its own
        return s

    def save_session_dialog(self) -> None:
        default = str(Path(self.window.file_actions.last_folder()) / f"attention{SUFFIX}")
        path, _ = QFileDialog.getSaveFileName(self.window, "Save session", default, SESSION_FILTER)
        if path:
            try:
                self.save_session(path)
            except UserError:
                pass  # already in the banner

    def open_session_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open session", self.window.file_actions.last_folder(), SESSION_FILTER)
        if path:
            self.open_session(path)

    # ------------------------------------------------------------------------------- saved runs
    def open_saved_run(self, source) -> bool:
        """Show a saved run (a .npz path, or a SavedRun already read) without its model, on the page it was
        saved from when the file says. A file is read in a worker (a long run's maps are large); a damaged
        or foreign one is one line in the banner, and nothing changes. False when nothing was started."""
        if isinstance(source, SavedRun):
            self._show_saved_run(source)
            return True
        path = str(source)
        started = self.state.submit(read_run, path, key="open-run", uses_model=False,
                                    on_result=lambda run: self._show_saved_run(run, path),
                                    on_error=self.window.show_error)
        if started:
            self.window.statusBar().showMessage(f"reading {Path(path).name}…", 3000)
        return started

    def _show_saved_run(self, run: SavedRun, path: str | None = None) -> None:
        if path is not None:
            self.window.settings.setValue("paths/last_folder", str(Path(path).parent))
        if run.view.get("colormap") not in COLORMAPS:
            run.view.pop("colormap", None)
        # the saved run's model was never loaded: it must not become the model the next start opens
        kept = {k: self.window.settings.value(k) for k in ("model/last", "model/last_text")}
        self.state.open_result(run)
        for key, value in kept.items():
            self.window.settings.remove(key) if value is None else self.window.settings.setValue(key, value)
        page = run.view.get("page")
        if isinstance(page, str) and page in self.window.pages:
            self.window.show_page(page)
        elif run.result.grid is not None and self.window.current_page_name in ("grid", "head", "tokens", "cost"):
            self.window.show_page("overlay")

    def open_run_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open saved run", self.window.file_actions.last_folder(), RUN_FILTER)
        if path:
            self.open_saved_run(path)

    def _saved_run_shown(self, label: str) -> None:
        """A saved run is on screen: say whose maps they are and that the model is not loaded."""
        r, info = self.state.result, self.state.info
        self.saved_run_line.setText(
            f"Opened from {label}: the saved maps of {info.name} ({r.num_tokens} tokens, d_k × {r.dk_scale:g}). "
            "The model is not loaded: choose one under Model to change d_k, n or the input, or to use the "
            "pages that run it.")
        self.window.status_labels["model"].setText(f"{info.name} (saved run, not loaded)")
        self.window.status_labels["model"].setToolTip(info.note)
        self.window.status_labels["device"].setText("")
        self.window.status_labels["forward"].setText("forward not timed (saved run)")
        self.window.status_labels["forward"].setToolTip("")
        self.window.setWindowTitle(f"attn-explorer — {label} (saved run of {info.name})")
        i = self.window.toolbar.model_combo.findData(info.name)
        if i >= 0:  # whether it is trained is not in the file: the picker says only what is known
            self.window.toolbar.model_combo.setItemText(i, f"{info.name} — not loaded")
            self.window.toolbar.model_combo.setItemData(i, f"the saved run's model; choose it to load {info.name} and run "
                                            "the input again", Qt.ToolTipRole)
        self._saved_run_mode(True)

    def _saved_run_mode(self, on: bool) -> None:
        """Switch the controls that run the model off while a saved run is shown, and on again after."""
        self.saved_run_line.setVisible(on)
        for panel in (self.window.dk_panel, self.window.input_panel):
            panel.setEnabled(not on)
            panel.setToolTip("a saved run is shown without its model: choose a model to use this" if on else "")
        self.window.seq_panel.setVisible(not on)  # its cost figures (FLOPs, forward time) need the model's sizes
        self.window.toolbar.dtype_combo.setEnabled(not on)

    def _follow_sliders(self) -> None:
        """The d_k slider and its one-layer switch show the state's value (a restored session sets it)."""
        st, panel = self.state, self.window.dk_panel
        want = slider_from_dk(st.dk_scale)
        if panel.slider.value() != want or panel.layer_only.isChecked() != st.dk_layer_only:
            with signals_blocked(panel.slider), signals_blocked(panel.layer_only):
                panel.slider.setValue(want)
                panel.layer_only.setChecked(st.dk_layer_only)
            panel._show_value()
