"""What the user asks of the window: the toolbar, the menus, files opened or dropped, export.

`WindowActions` is mixed into `MainWindow`; it only turns clicks, keys and dropped files into calls on
the session state (or the banner, when a file is bad). `Banner` is the window's non-blocking error line.
"""
from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFrame, QHBoxLayout, QInputDialog, QLabel,
                               QSpinBox, QToolBar, QToolButton, QWidget)
from superqt.utils import signals_blocked

from attn_explorer.errors import UserError
from attn_explorer.files import save_npz
from attn_explorer.gui.window.export import FORMATS, export_view
from attn_explorer.gui.window.export import HTML_FILTER, export_html as start_html_export
from attn_explorer.gui.widgets.heatmap import COLORMAPS
from attn_explorer.gui.window.pages import page_named
from attn_explorer.gui.window.sessions import SessionActions, saved_view
from attn_explorer.session.inputs import read_text_for
from attn_explorer.session.jobs import dtype_error_job

DTYPES = ("float32", "bfloat16", "float16")  # the weights' number formats load_model reads

TEXT_FILTER = "Text (*.txt *.md *.csv *.json *.py);;All files (*)"
TEXT_SUFFIXES = {".txt", ".md", ".csv", ".json", ".py", ".rst", ".tex"}
MAX_TEXT_BYTES = 1_000_000  # the models read at most a few thousand characters; more only slows the text box
IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.bmp *.gif *.webp *.tif *.tiff);;All files (*)"
OPEN_FOLDER = "Open model folder…"
HF_ID = "Hugging Face id…"
# the built-in models' descriptions open with "text, trained:" or "image, untrained:"
KIND = re.compile(r"^(text|image), (trained|untrained):\s*")


def model_item_text(name: str, description: str) -> str:
    """The picker's line for a built-in model: its name, kind (text or image) and whether it is trained."""
    m = KIND.match(description)
    return f"{name} — {m.group(1)}, {m.group(2)}" if m else name


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


class WindowActions(SessionActions):
    """Toolbar, menus and file handling of MainWindow (which provides state, settings, pages, show_error);
    sessions and saved runs come from `SessionActions` (gui/window/sessions.py)."""

    # ------------------------------------------------------------------------------- building
    def _build_toolbar(self) -> None:
        tb = QToolBar("View")
        tb.setObjectName("view-toolbar")
        tb.setMovable(False)
        self.addToolBar(tb)
        self.model_combo = QComboBox()
        self.model_combo.setMinimumWidth(200)
        self.model_combo.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        self.model_combo.setToolTip("Choose a model: built-in, a folder, or a Hugging Face id")
        self._fill_models([])
        self.model_combo.activated.connect(self._model_chosen)
        self.dtype_combo = QComboBox()
        self.dtype_combo.setObjectName("dtype")
        self.dtype_combo.addItems(DTYPES)
        self.dtype_combo.setCurrentText(self.state.dtype)
        self.dtype_combo.setToolTip("Number format of the weights: float32 is exact; bfloat16 and float16 take half "
                                    "the memory and round a little. Choosing one loads the model again")
        self.dtype_combo.activated.connect(lambda i: self.state.set_dtype(self.dtype_combo.itemText(i)))
        self.state.model_loaded.connect(lambda info: self._show_dtype())
        self.state.error_raised.connect(lambda _message: self._show_dtype())
        self._build_dtype_error()
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
        self.hide_special_box = QCheckBox("Hide specials")
        self.hide_special_box.setToolTip("Hide special tokens ([CLS], [SEP], BOS) in every view and "
                                         "renormalise each row over the remaining keys")
        self.hide_special_box.toggled.connect(lambda on: self.state.set_options(hide_special=on))
        for item in ((" Model ", self.model_combo), (" dtype ", self.dtype_combo), ("", self.dtype_error_button), None, (" Layer ", self.layer_spin), (" Head ", self.head_spin),
                     None, (" Colormap ", self.cmap_combo), (" Scale ", self.scale_combo), None,
                     ("", self.hide_special_box)):
            if item is None:
                tb.addSeparator()
                continue
            text, widget = item
            if text:
                tb.addWidget(QLabel(text))
            tb.addWidget(widget)

    def _build_menus(self) -> None:
        mb = self.menuBar()
        file = mb.addMenu("&File")
        # Ctrl+O / Ctrl+S open and save a session (below); an image is Ctrl+I, an export Ctrl+E
        self.act_open = self._action(file, "&Open image…", self.open_image_dialog, "Ctrl+I")
        self.act_open_text = self._action(file, "Open &text file…", self.open_text_dialog, "Ctrl+Shift+O")
        self._action(file, OPEN_FOLDER, self.open_model_folder_dialog)
        self._action(file, HF_ID, self.hf_id_dialog)
        file.addSeparator()
        self._build_sessions(file)
        file.addSeparator()
        self.act_export = self._action(file, "&Export…", self.export_dialog, "Ctrl+E")
        self.act_export_html = self._action(file, "Export page as &HTML…", self.export_html_dialog)
        file.addSeparator()
        # QKeySequence.Quit is empty on some platforms (offscreen, plain X11): name Ctrl+Q as well
        self._action(file, "&Quit", self.close, [QKeySequence.Quit, "Ctrl+Q"])
        view = mb.addMenu("&View")
        for i, name in enumerate(self.pages):
            title = page_named(name).title
            self._action(view, title, lambda n=name: self.show_page(n), f"Ctrl+{i + 1}" if i < 9 else None)
        view.addSeparator()
        self._action(view, "Previous layer", lambda: self.state.step_layer(-1), "Up")
        self._action(view, "Next layer", lambda: self.state.step_layer(1), "Down")
        self._action(view, "Previous head", lambda: self.state.step_head(-1), "Left")
        self._action(view, "Next head", lambda: self.state.step_head(1), "Right")
        view.addSeparator()
        view.addAction(self.act_dtype_error)

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

    # ------------------------------------------------------------------------------- model picker
    def _fill_models(self, builtins) -> None:
        current = self.state.info.name if self.state.info else ""
        combo = self.model_combo
        with signals_blocked(combo):
            combo.clear()
            names = [n for n, _ in builtins]
            for name, desc in builtins:
                combo.addItem(model_item_text(name, desc), name)
                combo.setItemData(combo.count() - 1, KIND.sub("", desc), Qt.ToolTipRole)
            if current and current not in names:
                combo.addItem(self._loaded_item_text(), current)
            if not builtins and not current:
                combo.addItem("loading…", None)
            combo.insertSeparator(combo.count())
            combo.addItem(OPEN_FOLDER, OPEN_FOLDER)
            combo.addItem(HF_ID, HF_ID)
        if current:
            self._select_model_item(current)

    def _show_dtype(self) -> None:
        """The dtype picker shows what the loaded model uses (a failed reload leaves the old one)."""
        with signals_blocked(self.dtype_combo):
            self.dtype_combo.setCurrentText(self.state.info.dtype if self.state.info else self.state.dtype)

    # ------------------------------------------------------------------------------- error vs float32
    DTYPE_ERROR_TIP = ("How far this 16-bit model's maps and last hidden state are from float32 on the current "
                       "input: runs it once more next to the checkpoint loaded in float32")

    def _build_dtype_error(self) -> None:
        """The "Error vs float32" button (and View menu entry), and its read-out in the status bar."""
        self.act_dtype_error = QAction("Error vs float32", self)
        self.act_dtype_error.setIconText("vs float32")  # the toolbar's short name: "dtype [bfloat16] [vs float32]"
        self.act_dtype_error.setToolTip(self.DTYPE_ERROR_TIP)
        self.act_dtype_error.triggered.connect(lambda *_: self.measure_dtype_error())
        self.dtype_error_button = QToolButton()
        self.dtype_error_button.setObjectName("dtype-error")
        self.dtype_error_button.setDefaultAction(self.act_dtype_error)
        # framed (a toolbar's buttons are flat): it reads as a button, not as a label of the dtype picker
        self.dtype_error_button.setStyleSheet("QToolButton { border: 1px solid #b8b8b8; border-radius: 3px; "
                                              "padding: 1px 5px; } QToolButton:hover { background: #e8eef7; }")
        self.dtype_error_label = QLabel("")
        self.dtype_error_label.setObjectName("dtype-error-readout")
        self.dtype_error_label.setStyleSheet("padding: 0 6px;")
        self.statusBar().addPermanentWidget(self.dtype_error_label)
        self._dtype_error_for: tuple | None = None  # (model info, input, run kwargs) measured or being measured
        self._dtype_error_pending = False  # a measurement is under way (its answer has not arrived)
        st = self.state
        st.model_loading.connect(lambda _src: self._clear_dtype_error())
        st.model_loaded.connect(lambda _info: self._clear_dtype_error())
        for sig in (st.text_changed, st.target_changed, st.attention_ready):
            sig.connect(lambda *_: self._dtype_error_check())
        st.input_cleared.connect(self._clear_dtype_error)
        st.busy_changed.connect(lambda _busy: self._enable_dtype_error())
        self._enable_dtype_error()

    def _dtype_error_source(self) -> tuple:
        x, kw = self.state.run_input()
        return self.state.info, x, kw

    @staticmethod
    def _same_source(a: tuple, b: tuple) -> bool:
        (info_a, x_a, kw_a), (info_b, x_b, kw_b) = a, b
        same_x = x_a == x_b if isinstance(x_a, str) and isinstance(x_b, str) else x_a is x_b
        return info_a is info_b and same_x and kw_a == kw_b

    def _enable_dtype_error(self) -> None:
        """Enabled for a loaded 16-bit model with input, when no measurement is under way."""
        st, info = self.state, self.state.info
        on = (info is not None and info.dtype != "float32" and st.has_model and st.has_input
              and not st.runner.loading and not self._dtype_error_pending)
        self.act_dtype_error.setEnabled(on)
        if info is not None and info.dtype == "float32" and self._dtype_error_for is None:
            self.act_dtype_error.setToolTip("The model is float32 already: choose bfloat16 or float16 in dtype "
                                            "to measure how far it is from float32")
        elif self._dtype_error_for is None:
            self.act_dtype_error.setToolTip(self.DTYPE_ERROR_TIP)

    def measure_dtype_error(self) -> bool:
        """Measure the loaded model's error against float32 on the current input, once (lane "dtype-error")."""
        if not self.act_dtype_error.isEnabled():
            return False
        source = self._dtype_error_source()
        _, x, kw = source
        started = self.state.submit(dtype_error_job, x, dict(kw), key="dtype-error",
                                    on_result=lambda d: self._dtype_error_arrived(source, d),
                                    on_error=lambda m: self._dtype_error_failed(source, m))
        if not started:
            return False
        self._dtype_error_for, self._dtype_error_pending = source, True
        self.dtype_error_label.setText("measuring error vs float32…")
        self.dtype_error_label.setToolTip("")
        self._enable_dtype_error()
        return True

    def _dtype_error_arrived(self, source: tuple, d: dict) -> None:
        if self._dtype_error_for is not source:
            return  # the input or model changed while it was measured
        self._dtype_error_pending = False
        g = lambda v: f"{v:.2g}"  # noqa: E731 - two significant figures
        text = (f"{d['dtype']} vs float32 on this input ({d['tokens']} tokens): maps ±{g(d['max_abs_attention'])} "
                f"(max abs), last hidden state ±{g(d['max_abs_hidden'])} of {g(d['hidden_scale'])}")
        tip = f"{text}. Reference: {d['reference']}. Measured once; it goes when the input, model or d_k changes"
        self.dtype_error_label.setText(f"vs float32: maps ±{g(d['max_abs_attention'])}, "
                                       f"hidden ±{g(d['max_abs_hidden'])} of {g(d['hidden_scale'])}")
        self.dtype_error_label.setToolTip(tip)
        self.act_dtype_error.setToolTip(tip)
        self._enable_dtype_error()

    def _dtype_error_failed(self, source: tuple, message: str) -> None:
        if self._dtype_error_for is source:
            self._clear_dtype_error()
        self.show_error(f"error vs float32: {message}")
        self._enable_dtype_error()

    def _dtype_error_check(self) -> None:
        """A new run, text or target: the read-out goes unless it still describes this model and input."""
        if self._dtype_error_for is not None and not self._same_source(self._dtype_error_for, self._dtype_error_source()):
            self._clear_dtype_error()
        self._enable_dtype_error()

    def _clear_dtype_error(self) -> None:
        if self._dtype_error_for is not None:
            self.state.cancel("dtype-error")
        self._dtype_error_for, self._dtype_error_pending = None, False
        self.dtype_error_label.setText("")
        self.dtype_error_label.setToolTip("")
        self._enable_dtype_error()

    def _loaded_item_text(self) -> str:
        """A model from a folder or the hub: its kind and training are known once it is loaded."""
        info = self.state.info
        return f"{info.name} — {info.modality}, {'trained' if info.trained else 'untrained'}"

    def _select_model_item(self, name: str) -> None:
        i = self.model_combo.findData(name)
        if i < 0:
            self.model_combo.insertItem(0, self._loaded_item_text(), name)
            i = 0
        elif self.state.info is not None and self.state.info.name == name:
            self.model_combo.setItemText(i, self._loaded_item_text())  # what loading it showed
        with signals_blocked(self.model_combo):
            self.model_combo.setCurrentIndex(i)

    def _model_chosen(self, index: int) -> None:
        data = self.model_combo.itemData(index)
        if data == OPEN_FOLDER:
            self.open_model_folder_dialog()
        elif data == HF_ID:
            self.hf_id_dialog()
        elif data:
            self.state.choose_model(data)  # the model loaded already: nothing to do
        if self.state.info is not None:
            self._select_model_item(self.state.info.name)
        self.focus_page()  # the arrows step layers and heads again, not through the model list

    # ------------------------------------------------------------------------------- files
    def open_image(self, path: str) -> None:
        self.settings.setValue("paths/last_folder", str(Path(path).parent))
        self.state.set_image(path)

    def open_text_file(self, path: str) -> bool:
        """Put a UTF-8 text file into the text box (which runs it). Bad files go to the banner, in the words
        of the command line's --text-file (the same reader: a pipe is refused, never waited on)."""
        p = Path(path)
        try:  # a file longer than the model reads is cut on the way in, with a note (session.inputs.read_text_for)
            text, note = read_text_for(p, self.state.info, MAX_TEXT_BYTES)
        except UserError as e:
            self.show_error(str(e))
            return False
        self.settings.setValue("paths/last_folder", str(p.parent))
        self.state.set_text(text, note)  # the text box follows the session's text_changed
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
            if Path(path).suffix.lower() == ".npz" and self.state.result is not None:
                # the arrays, and the view they were saved from, so Open saved run comes back to it
                out = save_npz(self.state.result, path, view=saved_view(self.state, self.current_page_name))
            else:
                out = export_view(Path(path).suffix, path, self.pages.get(self.current_page_name),
                                  self.state.result)
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

    def export_html(self, path: str) -> bool:
        """Write the self-contained page of the result, view and selection on screen (in a worker)."""
        return start_html_export(self, path)

    def export_html_dialog(self) -> None:
        default = str(Path(self._last_folder()) / f"attention-{self.current_page_name or 'view'}.html")
        path, _ = QFileDialog.getSaveFileName(self, "Export page as HTML", default, HTML_FILTER)
        if path:
            self.export_html(path if Path(path).suffix.lower() in (".html", ".htm") else path + ".html")

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
        if Path(path).suffix.lower() in (".axsession", ".npz"):
            (self.open_session if path.lower().endswith(".axsession") else self.open_saved_run)(path)
        elif Path(path).is_dir():
            self.open_model_folder(path)
        elif Path(path).suffix.lower() in TEXT_SUFFIXES:
            self.open_text_file(path)
        else:
            self.open_image(path)
        ev.acceptProposedAction()
