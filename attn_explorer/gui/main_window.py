"""The main window: pages registered by name, the side panels, menus, status bar and error banner.

Pages are looked up in `PAGES` (name -> title and factory), so later pages (lessons, generation,
analyses) add themselves with `register_page` and become reachable from the View menu and `--view`.
The window never runs a model: it forwards intent to `SessionState` and draws what comes back.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDockWidget, QFileDialog, QFrame, QHBoxLayout,
                               QInputDialog, QLabel, QMainWindow, QProgressBar, QScrollArea, QSpinBox,
                               QTabWidget, QToolBar, QToolButton, QVBoxLayout, QWidget)

from attn_explorer.gui.controls import DkPanel, InputPanel, SeqLenPanel
from attn_explorer.gui.export import FORMATS, export_view
from attn_explorer.gui.grid_view import HeadGridView
from attn_explorer.gui.head_view import HeadView
from attn_explorer.gui.heatmap import COLORMAPS, PaintedGraphicsWidget
from attn_explorer.gui.overlay_view import PatchOverlayView
from attn_explorer.gui.token_view import TokenFocusView
from attn_explorer.session.state import SessionState

TEXT_FILTER = "Text (*.txt *.md *.csv *.json *.py);;All files (*)"
TEXT_SUFFIXES = {".txt", ".md", ".csv", ".json", ".py", ".rst", ".tex"}
MAX_TEXT_BYTES = 1_000_000  # the models read at most a few thousand characters; more only slows the text box
IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.bmp *.gif *.webp *.tif *.tiff);;All files (*)"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
OPEN_FOLDER = "Open model folder…"
HF_ID = "Hugging Face id…"

# name -> (tab title, factory(state) -> QWidget). Insertion order is tab order.
PAGES: dict[str, tuple[str, Callable[[SessionState], QWidget]]] = {}


def register_page(name: str, title: str, factory: Callable[[SessionState], QWidget]) -> None:
    PAGES[name] = (title, factory)


register_page("grid", "All heads", HeadGridView)
register_page("head", "One head", HeadView)
register_page("tokens", "Token focus", TokenFocusView)
register_page("overlay", "Patch overlay", PatchOverlayView)


def _register_cost_page() -> None:
    """The cost lab lives in its own module; a failure there must not break the window."""
    if "cost" in PAGES:
        return
    try:
        from attn_explorer.gui.cost_page import CostPage
    except Exception:  # noqa: BLE001
        return
    register_page("cost", "Cost of attention", lambda state: CostPage())


class Banner(QFrame):
    """A non-blocking, dismissable error line at the top of the window."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.setStyleSheet("#banner { background: #fdecea; border: 1px solid #f5c2c0; border-radius: 4px; }"
                           "QLabel { color: #8a1c1c; }")
        self.label = QLabel("")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAutoRaise(True)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 4, 4)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.close_button)
        self.close_button.clicked.connect(self.hide)
        self.hide()

    def show_message(self, text: str) -> None:
        self.label.setText(f"⚠ {text}")
        self.show()

    @property
    def text(self) -> str:
        return self.label.text()


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

        # pages
        _register_cost_page()
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.pages: dict[str, QWidget] = {}
        for name, (title, factory) in PAGES.items():
            try:
                page = factory(state)
            except Exception as exc:  # noqa: BLE001 - one broken page must not break the window
                page = QLabel(f"This page failed to start: {type(exc).__name__}: {exc}")
            page.setObjectName(f"page-{name}")
            self.pages[name] = page
            self.tabs.addTab(page, title)
            for canvas in page.findChildren(PaintedGraphicsWidget):
                canvas.painted.connect(self._painted)
        self.grid = self.pages["grid"]
        self.head_view = self.pages["head"]
        self.token_view = self.pages["tokens"]
        self.overlay = self.pages["overlay"]
        self.grid.head_opened.connect(lambda *_: self.show_page("head"))

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
        self.input_panel.open_image_requested.connect(self.open_image_dialog)
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

        self._build_toolbar()
        self._build_menus()
        self._build_statusbar()

        state.attention_ready.connect(self._result_arrived)
        state.model_loading.connect(self._loading)
        state.load_progressed.connect(self._progress)
        state.model_loaded.connect(self._loaded)
        state.models_listed.connect(self._fill_models)
        state.error_raised.connect(self.show_error)
        state.selection_changed.connect(self._selection)
        state.options_changed.connect(self._sync_options)
        self.restore_settings()

    # ------------------------------------------------------------------------------- building
    def _build_toolbar(self) -> None:
        tb = QToolBar("View")
        tb.setObjectName("view-toolbar")
        tb.setMovable(False)
        self.addToolBar(tb)
        self.model_combo = QComboBox()
        self.model_combo.setMinimumWidth(180)
        self.model_combo.setToolTip("Choose a model: built-in, a folder, or a Hugging Face id")
        self._fill_models([])
        self.model_combo.activated.connect(self._model_chosen)
        self.layer_spin = QSpinBox()
        self.head_spin = QSpinBox()
        for s in (self.layer_spin, self.head_spin):
            s.setRange(0, 0)
            s.setKeyboardTracking(True)
        self.layer_spin.valueChanged.connect(lambda v: self.state.select(layer=v))
        self.head_spin.valueChanged.connect(lambda v: self.state.select(head=v))
        self.cmap_combo = QComboBox()
        self.cmap_combo.addItems(COLORMAPS)
        self.cmap_combo.currentTextChanged.connect(lambda name: self.state.set_options(colormap=name))
        self.scale_combo = QComboBox()
        self.scale_combo.addItems(["linear", "log"])
        self.scale_combo.currentTextChanged.connect(lambda s: self.state.set_options(log_scale=(s == "log")))
        tb.addWidget(QLabel(" Model "))
        tb.addWidget(self.model_combo)
        tb.addSeparator()
        tb.addWidget(QLabel(" Layer "))
        tb.addWidget(self.layer_spin)
        tb.addWidget(QLabel(" Head "))
        tb.addWidget(self.head_spin)
        tb.addSeparator()
        tb.addWidget(QLabel(" Colormap "))
        tb.addWidget(self.cmap_combo)
        tb.addWidget(QLabel(" Scale "))
        tb.addWidget(self.scale_combo)

    def _build_menus(self) -> None:
        mb = self.menuBar()
        file = mb.addMenu("&File")
        self.act_open = self._action(file, "&Open image…", self.open_image_dialog, QKeySequence.Open)
        self.act_open_text = self._action(file, "Open &text file…", self.open_text_dialog, "Ctrl+Shift+O")
        self._action(file, OPEN_FOLDER, self.open_model_folder_dialog)
        self._action(file, HF_ID, self.hf_id_dialog)
        file.addSeparator()
        self.act_export = self._action(file, "&Export…", self.export_dialog, QKeySequence.Save)
        file.addSeparator()
        # QKeySequence.Quit is empty on some platforms (offscreen, plain X11): name Ctrl+Q as well
        self._action(file, "&Quit", self.close, [QKeySequence.Quit, "Ctrl+Q"])
        view = mb.addMenu("&View")
        for i, name in enumerate(self.pages):
            title = PAGES[name][0]
            self._action(view, title, lambda n=name: self.show_page(n), f"Ctrl+{i + 1}" if i < 9 else None)
        view.addSeparator()
        self._action(view, "Previous layer", lambda: self.state.step_layer(-1), "Up")
        self._action(view, "Next layer", lambda: self.state.step_layer(1), "Down")
        self._action(view, "Previous head", lambda: self.state.step_head(-1), "Left")
        self._action(view, "Next head", lambda: self.state.step_head(1), "Right")

    def _action(self, menu, text, slot, shortcut=None) -> QAction:
        act = QAction(text, self)
        if isinstance(shortcut, list):
            keys: list[QKeySequence] = []
            for k in shortcut:
                more = QKeySequence.keyBindings(k) if isinstance(k, QKeySequence.StandardKey) else [QKeySequence(k)]
                keys += [q for q in more if not q.isEmpty() and q not in keys]
            act.setShortcuts(keys)
        elif shortcut is not None:
            act.setShortcut(QKeySequence(shortcut))
        act.triggered.connect(lambda *_: slot())
        menu.addAction(act)
        return act

    def _build_statusbar(self) -> None:
        sb = self.statusBar()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(220)
        self.progress.hide()
        self.status_labels = {k: QLabel("") for k in ("model", "device", "tokens", "forward", "render")}
        sb.addPermanentWidget(self.progress)
        for lab in self.status_labels.values():
            lab.setStyleSheet("padding: 0 6px;")
            sb.addPermanentWidget(lab)

    # ------------------------------------------------------------------------------- pages
    def show_page(self, name: str) -> None:
        if name not in self.pages:
            raise KeyError(name)
        self.tabs.setCurrentWidget(self.pages[name])

    @property
    def current_page_name(self) -> str:
        w = self.tabs.currentWidget()
        return next((n for n, p in self.pages.items() if p is w), "")

    # ------------------------------------------------------------------------------- state -> view
    def _result_arrived(self, r) -> None:
        self._result_at = self.state.ready_at or time.perf_counter()
        s = self.status_labels
        s["tokens"].setText(f"n = {r.num_tokens}")
        s["forward"].setText(f"forward {r.forward_ms:.1f} ms")
        for note in r.notes:
            self.statusBar().showMessage(note, 5000)

    def _painted(self) -> None:
        if self._result_at is None:
            return
        canvas = self.sender()
        page = self.tabs.currentWidget()
        if canvas is None or not page.isAncestorOf(canvas):
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
        self.banner.hide()
        untrained = "" if info.trained else " (untrained)"
        self.status_labels["model"].setText(f"{info.name}{untrained}")
        self.status_labels["model"].setToolTip(info.note or info.name)
        self.status_labels["device"].setText(f"{info.device} · {info.dtype}")
        self.setWindowTitle(f"attn-explorer — {info.name}{untrained}")
        for spin, top, val in ((self.layer_spin, info.num_layers, self.state.layer),
                               (self.head_spin, info.num_heads, self.state.head)):
            spin.blockSignals(True)
            spin.setRange(0, top - 1)
            spin.setValue(val)
            spin.blockSignals(False)
        self._select_model_item(info.name)
        self.settings.setValue("model/last", info.name)
        if info.modality == "text":
            self.settings.setValue("model/last_text", info.name)
        if info.modality == "image" and self.current_page_name in ("tokens",):
            self.show_page("overlay")

    def _fill_models(self, builtins) -> None:
        current = self.state.info.name if self.state.info else ""
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        names = [n for n, _ in builtins]
        for name, desc in builtins:
            self.model_combo.addItem(name, name)
            self.model_combo.setItemData(self.model_combo.count() - 1, desc, Qt.ToolTipRole)
        if current and current not in names:
            self.model_combo.addItem(current, current)
        if not builtins and not current:
            self.model_combo.addItem("loading…", None)
        self.model_combo.insertSeparator(self.model_combo.count())
        self.model_combo.addItem(OPEN_FOLDER, OPEN_FOLDER)
        self.model_combo.addItem(HF_ID, HF_ID)
        self.model_combo.blockSignals(False)
        if current:
            self._select_model_item(current)

    def _select_model_item(self, name: str) -> None:
        i = self.model_combo.findData(name)
        if i < 0:
            self.model_combo.insertItem(0, name, name)
            i = 0
        self.model_combo.blockSignals(True)
        self.model_combo.setCurrentIndex(i)
        self.model_combo.blockSignals(False)

    def _model_chosen(self, index: int) -> None:
        data = self.model_combo.itemData(index)
        if data == OPEN_FOLDER:
            self.open_model_folder_dialog()
        elif data == HF_ID:
            self.hf_id_dialog()
        elif data:
            self.state.load_model(data, want_image=None)
        if self.state.info is not None:
            self._select_model_item(self.state.info.name)

    def _selection(self, layer: int, head: int) -> None:
        for spin, v in ((self.layer_spin, layer), (self.head_spin, head)):
            spin.blockSignals(True)
            spin.setValue(v)
            spin.blockSignals(False)

    def _sync_options(self) -> None:
        st = self.state
        for combo, text in ((self.cmap_combo, st.colormap), (self.scale_combo, "log" if st.log_scale else "linear")):
            combo.blockSignals(True)
            combo.setCurrentText(text)
            combo.blockSignals(False)
        self.settings.setValue("view/colormap", st.colormap)
        self.settings.setValue("view/log_scale", bool(st.log_scale))

    def show_error(self, message: str) -> None:
        """Non-blocking: a banner over the view and a status message; the last good view stays."""
        self.progress.hide()
        self.banner.show_message(message)
        self.statusBar().showMessage(message, 8000)

    # ------------------------------------------------------------------------------- user intent
    def open_image(self, path: str) -> None:
        self.settings.setValue("paths/last_folder", str(Path(path).parent))
        self.state.set_image(path)

    def open_text_file(self, path: str) -> bool:
        """Put a UTF-8 text file into the text box (which runs it). Bad files go to the banner."""
        p = Path(path)
        try:
            if p.stat().st_size > MAX_TEXT_BYTES:
                raise ValueError(f"{p.name} is larger than {MAX_TEXT_BYTES // 1_000_000} MB; open a shorter text")
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            self.show_error(f"{p.name} is not UTF-8 text")
            return False
        except (OSError, ValueError) as e:
            self.show_error(str(e) if isinstance(e, ValueError) else f"cannot read {p.name}: {e.strerror or e}")
            return False
        if not text.strip():
            self.show_error(f"{p.name} is empty")
            return False
        self.settings.setValue("paths/last_folder", str(p.parent))
        self.input_panel.text.setPlainText(text)  # textChanged -> the debounced run
        return True

    def open_text_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open text file", self._last_folder(), TEXT_FILTER)
        if path:
            self.open_text_file(path)

    def open_model_folder(self, path: str) -> None:
        self.settings.setValue("paths/last_folder", str(Path(path).parent))
        self.state.load_model(path, want_image=None)

    def _last_folder(self) -> str:
        return str(self.settings.value("paths/last_folder", str(Path.home())))

    def open_image_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open image", self._last_folder(), IMAGE_FILTER)
        if path:
            self.open_image(path)

    def open_model_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open model folder", self._last_folder())
        if path:
            self.open_model_folder(path)

    def hf_id_dialog(self) -> None:
        text, ok = QInputDialog.getText(self, "Hugging Face id", "Model id (for example bert-base-uncased):")
        if ok and text.strip():
            self.state.load_model(text.strip(), want_image=None)

    def export(self, path: str) -> Path:
        """Export the current page (.png/.svg) or the attention arrays (.npz); errors go to the banner."""
        try:
            out = export_view(Path(path).suffix, path, self.tabs.currentWidget(), self.state.result)
        except Exception as exc:  # noqa: BLE001 - shown, then re-raised for callers that care
            from attn_explorer.session.workers import error_message

            self.show_error(error_message(exc))
            raise
        self.settings.setValue("paths/last_folder", str(Path(path).parent))
        self.statusBar().showMessage(f"saved {out}", 5000)
        return out

    def export_dialog(self) -> None:
        filters = ";;".join(FORMATS.values())
        default = str(Path(self._last_folder()) / f"attention-{self.current_page_name or 'view'}.png")
        path, chosen = QFileDialog.getSaveFileName(self, "Export", default, filters)
        if not path:
            return
        if Path(path).suffix.lower() not in FORMATS:
            ext = next((e for e, f in FORMATS.items() if f == chosen), ".png")
            path += ext
        try:
            self.export(path)
        except Exception:  # noqa: BLE001 - already shown in the banner
            pass

    # ------------------------------------------------------------------------------- drag and drop
    def dragEnterEvent(self, ev):  # noqa: N802
        urls = ev.mimeData().urls() if ev.mimeData().hasUrls() else []
        if urls and urls[0].isLocalFile():
            ev.acceptProposedAction()

    def dropEvent(self, ev):  # noqa: N802
        urls = ev.mimeData().urls()
        if not urls:
            return
        path = urls[0].toLocalFile()
        if Path(path).is_dir():
            self.open_model_folder(path)
        elif Path(path).suffix.lower() in TEXT_SUFFIXES:
            self.open_text_file(path)
        else:
            self.open_image(path)
        ev.acceptProposedAction()

    # ------------------------------------------------------------------------------- settings
    def restore_settings(self) -> None:
        s = self.settings
        geo = s.value("window/geometry")
        if geo is not None:
            self.restoreGeometry(geo)
        lay = s.value("window/state")
        if lay is not None:
            self.restoreState(lay)
        cmap = str(s.value("view/colormap", self.state.colormap))
        log = str(s.value("view/log_scale", "false")).lower() in ("true", "1")
        self.state.set_options(colormap=cmap if cmap in COLORMAPS else "viridis", log_scale=log)
        self._sync_options()

    def save_settings(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/state", self.saveState())
        self.settings.sync()

    def closeEvent(self, ev):  # noqa: N802
        self.save_settings()
        self.state.shutdown()
        super().closeEvent(ev)
