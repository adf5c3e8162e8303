"""The main window: pages registered by name, the side panels, status bar and error banner.

Pages are built from `window.pages.PAGES` (one `Page(name, title, factory, group)` row each), and so
reachable by name from the View menu, `--view` and `--lesson`.
The window never runs a model: it forwards intent to `SessionState` through the parts it holds (the
toolbar, `toolbar.ViewToolbar`; files and export, `actions.FileActions`; sessions and saved runs,
`sessions.SessionActions`; the menus are built from them in `menus.py`) and draws what comes back.
"""
from __future__ import annotations

import time

from PySide6.QtCore import QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (QDockWidget, QLabel, QMainWindow, QProgressBar, QScrollArea, QTabWidget, QVBoxLayout,
                               QWidget)

from attn_explorer.gui.window.actions import FileActions
from attn_explorer.gui.window.banner import Banner
from attn_explorer.gui.window.menus import build_menus
from attn_explorer.gui.window.sessions import SessionActions
from attn_explorer.gui.window.toolbar import ViewToolbar
from attn_explorer.gui.window.pages import FITTED_PAGES, LESSON_NAMES, PAGES
from attn_explorer.gui.explorer.controls import DkPanel, InputPanel
from attn_explorer.gui.widgets.heatmap import COLORMAPS, PaintedGraphicsWidget
from attn_explorer.gui.explorer.seq_panel import SeqLenPanel, forward_word, human_duration, shared_note
from attn_explorer.session.state import SessionState

FIRST_SHARE = 0.8  # the first window (no saved geometry) takes this share of the screen's free area
FIRST_MIN = (1024, 700)  # ... and at least this much (never more than the screen)


def first_window_size(avail_w: int, avail_h: int) -> tuple[int, int]:
    """The first window's size on a screen whose available area is avail_w × avail_h."""
    return (min(avail_w, max(FIRST_MIN[0], round(FIRST_SHARE * avail_w))),
            min(avail_h, max(FIRST_MIN[1], round(FIRST_SHARE * avail_h))))


class MainWindow(QMainWindow):
    """The explorer window. `state` and `settings` are injected (tests give temporary ones)."""

    frame_painted = Signal(float)  # ms from the newest result to its first paint on the current page

    def __init__(self, state: SessionState, settings: QSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.settings = settings
        self.setWindowTitle("attn-explorer")
        self.setAcceptDrops(True)
        self._result_at: float | None = None
        self.render_ms = 0.0
        self._note: str = ""  # the result's note now in the status bar, cleared with that result
        self._error_at = 0.0  # perf_counter when the banner's error was shown
        self._page_pinned = False  # the command line chose the page: the first model load keeps it
        self.file_actions = FileActions(self, state)

        # pages
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        # nine top-level tabs: a little less padding than the style's, so all of them show at 1024 px
        self.tabs.tabBar().setStyleSheet("QTabBar::tab { padding: 5px 8px; }")
        self.pages: dict[str, QWidget] = {}
        self._tab_of: dict[str, QWidget] = {}  # page name -> the tab holding it
        self._groups: dict[str, QTabWidget] = {}  # group title -> its tab of sub-tabs
        self._group_of: dict[str, str] = {}  # page name -> the title of the tab it shares with others
        for row in PAGES:
            name, title, group = row.name, row.title, row.group
            if name in LESSON_NAMES:
                continue  # the Lessons tab lists them and builds each the first time it is shown
            try:
                page = row.factory(state)
            except Exception as exc:  # noqa: BLE001 - one broken page must not break the window
                page = QLabel(f"This page failed to start: {type(exc).__name__}: {exc}")
            page.setObjectName(f"page-{name}")
            if page.focusPolicy() == Qt.NoFocus:
                page.setFocusPolicy(Qt.ClickFocus)  # a click on the page takes the keys from the text box
            self.pages[name] = page
            holder = page
            if name not in FITTED_PAGES:
                # other pages scroll when they need more room than a small screen (1024×700) has,
                # instead of forcing the window larger
                holder = QScrollArea()
                holder.setWidgetResizable(True)
                holder.setFrameShape(QScrollArea.NoFrame)
                holder.setWidget(page)
            self._tab_of[name] = holder
            if group is None:
                self.tabs.addTab(holder, title)
            else:
                self._group_of[name] = group
                if group not in self._groups:
                    inner = self._groups[group] = QTabWidget()
                    inner.setDocumentMode(True)
                    self.tabs.addTab(inner, group)
                self._groups[group].addTab(holder, title)
            for canvas in page.findChildren(PaintedGraphicsWidget):
                canvas.painted.connect(self._painted)
        self.grid = self.pages["grid"]
        self.head_view = self.pages["head"]
        self.token_view = self.pages["tokens"]
        self.overlay = self.pages["overlay"]
        self.grid.head_opened.connect(lambda *_: self.show_page("head"))
        for view in (self.head_view, self.token_view):
            view.inside_requested.connect(lambda *_: self.open_lesson("inside-a-head"))
        for page in self.pages.values():  # analysis pages open a head too
            if page is not self.grid and hasattr(page, "head_opened"):
                page.head_opened.connect(lambda *_: self.show_page("head"))
        self.tabs.currentChanged.connect(self._page_switched)
        for inner in self._groups.values():
            inner.currentChanged.connect(self._page_switched)

        self.banner = Banner()
        central = QWidget()
        lay = QVBoxLayout(central)
        lay.setContentsMargins(4, 4, 4, 0)
        lay.addWidget(self.banner)
        lay.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

        # side panels
        self.input_panel = InputPanel(state)
        self.dk_panel = DkPanel(state)
        self.seq_panel = SeqLenPanel(state)
        self.input_panel.open_image_requested.connect(self.file_actions.open_image_dialog)
        side = QWidget()
        side_lay = QVBoxLayout(side)
        side_lay.setContentsMargins(2, 2, 2, 2)
        side_lay.addWidget(self.input_panel)
        side_lay.addWidget(self.dk_panel)
        side_lay.addWidget(self.seq_panel)
        side_lay.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(side)
        scroll.setMinimumWidth(380)
        self.dock = QDockWidget("Input and sliders", self)
        self.dock.setObjectName("controls-dock")
        self.dock.setWidget(scroll)
        self.dock.setFeatures(QDockWidget.DockWidgetMovable | QDockWidget.DockWidgetFloatable)
        self.addDockWidget(Qt.LeftDockWidgetArea, self.dock)

        self.toolbar = tb = ViewToolbar(self, state)
        # the toolbar's controls, by the names the rest of the window and the tests use
        self.model_combo, self.dtype_combo, self.layer_spin, self.head_spin = (tb.model_combo, tb.dtype_combo,
                                                                               tb.layer_spin, tb.head_spin)
        self.cmap_combo, self.scale_combo, self.hide_special_box = tb.cmap_combo, tb.scale_combo, tb.hide_special_box
        self.dtype_error_button, self.dtype_error_label, self.act_dtype_error = (tb.dtype_error_button,
                                                                                 tb.dtype_error_label, tb.act_dtype_error)
        self.session_actions = SessionActions(self, state)  # its saved-run line goes under the banner
        self.saved_run_line = self.session_actions.saved_run_line
        from attn_explorer.gui.window.pin import PinToggle  # issue 24: keep a model in memory across switches

        self.pin = PinToggle(self, state, settings, tb.model_combo)
        build_menus(self)
        self.act_open_run = self.session_actions.act_open_run
        self._build_statusbar()

        state.attention_ready.connect(self._result_arrived)
        state.input_cleared.connect(self._input_cleared)
        state.model_loading.connect(self._loading)
        state.load_progressed.connect(self._progress)
        state.model_loaded.connect(self._loaded)
        state.models_listed.connect(tb.fill_models)
        state.error_raised.connect(self.show_error)
        state.selection_changed.connect(tb.show_selection)
        state.options_changed.connect(self._sync_options)
        self.restore_settings()

    def _build_statusbar(self) -> None:
        sb = self.statusBar()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(220)
        self.progress.hide()
        self.status_labels = {k: QLabel("") for k in ("model", "device", "tokens", "reuse", "forward", "render")}
        sb.addPermanentWidget(self.progress)
        from attn_explorer.gui.window.run_line import RunLine  # issue 24: the run in flight, and Stop (Esc)

        self.run_line = RunLine(self.state)
        sb.insertPermanentWidget(0, self.run_line, 1)  # permanent: a status message does not hide it
        QShortcut(QKeySequence(Qt.Key_Escape), self, self.run_line.stop)
        for lab in self.status_labels.values():
            lab.setStyleSheet("padding: 0 6px;")
            sb.addPermanentWidget(lab)

    # ------------------------------------------------------------------------------- pages
    def show_page(self, name: str, pin: bool = False) -> None:
        """Show page `name` (a lesson's name opens the Lessons tab at it); pin=True (the command line's --view
        or --lesson) keeps it when the first model loads."""
        if name in LESSON_NAMES:
            self.show_page("lessons", pin)
            self.pages["lessons"].show_lesson(name)
            return
        if name not in self.pages:
            raise KeyError(name)
        self._page_pinned = self._page_pinned or pin
        group = self._group_of.get(name)
        if group is not None:
            self._groups[group].setCurrentWidget(self._tab_of[name])
            self.tabs.setCurrentWidget(self._groups[group])
        else:
            self.tabs.setCurrentWidget(self._tab_of[name])

    def open_lesson(self, name: str) -> None:
        """Show the Lessons tab at lesson `name` (the views' "look inside this head" path)."""
        if name not in LESSON_NAMES:
            raise KeyError(name)
        self.show_page(name)

    def _page_switched(self, _index: int) -> None:
        # the render time is measured from a result to the current page's paint; a switch breaks that
        self._result_at = None
        self.status_labels["render"].setText("")

    @property
    def current_page_name(self) -> str:
        w = self.tabs.currentWidget()
        if isinstance(w, QTabWidget) and w in self._groups.values():
            w = w.currentWidget()
        return next((n for n, t in self._tab_of.items() if t is w), "")

    # ------------------------------------------------------------------------------- state -> view
    def _result_arrived(self, r) -> None:
        self._result_at = self.state.ready_at or time.perf_counter()
        if self.banner.isVisible() and self.state.result_asked_at > self._error_at:
            self.banner.hide()  # it described a failure before this run was asked for
        s = self.status_labels
        s["tokens"].setText(f"n = {r.num_tokens}")
        beside, tip = shared_note(self.state.shared_cores(r))  # timed beside a side job: it says so
        s["forward"].setText(f"{forward_word(r)} {human_duration(r.forward_ms)}" + (" (first run: includes warm-up)" if r.warm_up else "") + beside)
        s["forward"].setToolTip(tip)
        # what an edit reused of the last run (prefix reuse), or why nothing could be: the reason in brackets
        # goes to the tooltip, so the bar still fits at 1024 px
        s["reuse"].setText(r.reuse.split(" (")[0])
        s["reuse"].setToolTip(r.reuse)
        sb = self.statusBar()
        if self._note and sb.currentMessage() == self._note:
            sb.clearMessage()  # it described the result before this one
        self._note = "; ".join(r.notes)
        if self._note:
            sb.showMessage(self._note, 8000)

    def _input_cleared(self) -> None:
        """No input: the read-outs of the result that went go with it."""
        self._result_at = None
        for key in ("tokens", "reuse", "forward", "render"):
            self.status_labels[key].setText("")
        for key in ("reuse", "forward"):
            self.status_labels[key].setToolTip("")
        if self._note and self.statusBar().currentMessage() == self._note:
            self.statusBar().clearMessage()
        self._note = ""

    def _painted(self) -> None:
        if self._result_at is None:
            return
        canvas = self.sender()
        page = self._tab_of.get(self.current_page_name)
        if canvas is None or page is None or not page.isAncestorOf(canvas):
            return
        self.render_ms = (time.perf_counter() - self._result_at) * 1000.0
        self._result_at = None
        self.status_labels["render"].setText(f"render {self.render_ms:.1f} ms")
        self.frame_painted.emit(self.render_ms)

    def _loading(self, src: str) -> None:
        self.progress.setValue(0)
        self.progress.setFormat(f"loading {src or 'default model'}… %p%")
        self.progress.show()

    def _progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(max(0.0, min(1.0, fraction)) * 1000))
        if message:
            self.progress.setToolTip(message)
            self.statusBar().showMessage(message, 3000)

    def _loaded(self, info) -> None:
        self.progress.hide()
        if not self.state.host.came_back:  # a failed load's line stays while the model it let go is read again
            self.banner.hide()
        untrained = "" if info.trained else " (untrained)"
        for key in ("tokens", "reuse", "forward", "render"):  # they described the old model's run, until this one's
            self.status_labels[key].setText("")
        for key in ("reuse", "forward"):
            self.status_labels[key].setToolTip("")
        self.status_labels["model"].setText(f"{info.name}{untrained}")
        self.status_labels["model"].setToolTip(info.note or info.name)
        self.status_labels["device"].setText(f"{info.device} · {info.dtype}")
        self.setWindowTitle(f"attn-explorer — {info.name}{untrained}")
        self.toolbar.sync_ranges()
        self.toolbar.select_model_item(info.name)
        self.settings.setValue("model/last", info.name)
        if info.modality == "text":
            self.settings.setValue("model/last_text", info.name)
        # image models open on the overlay, text models leave it (it has nothing to show them)
        pinned, self._page_pinned = self._page_pinned, False
        if not pinned and info.modality in ("image", "image-text") and self.current_page_name in ("grid", "head", "tokens"):
            self.show_page("overlay")
        elif not pinned and info.modality == "text" and self.current_page_name == "overlay":
            self.show_page("grid")

    def _sync_options(self) -> None:
        self.toolbar.show_options()
        self.settings.setValue("view/colormap", self.state.colormap)
        self.settings.setValue("view/log_scale", bool(self.state.log_scale))

    def show_error(self, message: str) -> None:
        """Non-blocking: a banner over the view and a status message; the last good view stays."""
        self.progress.hide()
        self._error_at = time.perf_counter()
        self.banner.show_message(message)
        self.statusBar().showMessage(message, 8000)

    # ------------------------------------------------------------------------------- settings
    def restore_settings(self) -> None:
        s = self.settings
        geo = s.value("window/geometry")
        if geo is None or not self.restoreGeometry(geo):
            self._first_geometry()
        lay = s.value("window/state")
        if lay is not None:
            self.restoreState(lay)
        cmap = str(s.value("view/colormap", self.state.colormap))
        log = str(s.value("view/log_scale", "false")).lower() in ("true", "1")
        self.state.set_options(colormap=cmap if cmap in COLORMAPS else "viridis", log_scale=log)
        self._sync_options()

    def _first_geometry(self) -> None:
        """No saved geometry: most of the screen, centred (Qt's own default cut off layers and the colour bar)."""
        screen = self.screen()
        if screen is None:
            return
        avail = screen.availableGeometry()
        w, h = first_window_size(avail.width(), avail.height())
        self.resize(QSize(w, h))
        self.move(avail.x() + (avail.width() - w) // 2, avail.y() + (avail.height() - h) // 2)

    def showEvent(self, ev):  # noqa: N802
        super().showEvent(ev)
        if not getattr(self, "_focused_once", False):
            self._focused_once = True
            QTimer.singleShot(0, self.focus_page)

    def focus_page(self) -> None:
        """Put the keyboard on the page shown, so the arrows step layers and heads at once (the text box
        keeps its own arrows while it has the focus)."""
        holder = self._tab_of.get(self.current_page_name)
        if holder is None:
            return
        page = self.pages[self.current_page_name]
        target = next((c for c in page.findChildren(PaintedGraphicsWidget) if c.isVisible()), None)
        (target or holder).setFocus(Qt.OtherFocusReason)

    def save_settings(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/state", self.saveState())
        self.settings.sync()

    def closeEvent(self, ev):  # noqa: N802
        self.save_settings()
        self.state.shutdown(wait=False)  # never hold the window open on a forward pass
        super().closeEvent(ev)

    # ------------------------------------------------------------------------------- files
    def dragEnterEvent(self, ev):  # noqa: N802
        if self.file_actions.accepts(ev):
            ev.acceptProposedAction()

    def dropEvent(self, ev):  # noqa: N802
        urls = ev.mimeData().urls()
        if not urls:
            return
        self.file_actions.open_dropped(urls[0].toLocalFile())
        ev.acceptProposedAction()

    # what the command line, ax.open and scripts call on the window, held by its parts
    def open_image(self, path: str) -> None:
        self.file_actions.open_image(path)

    def open_text_file(self, path: str) -> bool:
        return self.file_actions.open_text_file(path)

    def open_model_folder(self, path: str) -> None:
        self.file_actions.open_model_folder(path)

    def export(self, path: str):
        return self.file_actions.export(path)

    def export_html(self, path: str) -> bool:
        return self.file_actions.export_html(path)

    def save_session(self, path: str):
        return self.session_actions.save_session(path)

    def open_session(self, path: str) -> bool:
        return self.session_actions.open_session(path)

    def open_saved_run(self, source) -> bool:
        return self.session_actions.open_saved_run(source)

    def measure_dtype_error(self) -> bool:
        return self.toolbar.measure_dtype_error()
