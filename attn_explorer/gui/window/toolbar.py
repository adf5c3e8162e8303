"""The window's toolbar: the model and dtype pickers, "Error vs float32", layer and head, colormap, scale
and hide specials.

`ViewToolbar(window, state)` is held by the window (`window.toolbar`); it builds the toolbar into it and
turns choices into calls on the session state. The model picker lists the built-in models and names the
one loaded; "Error vs float32" measures a 16-bit model against its float32 checkpoint on the current input
(lane "dtype-error") and reads the answer out in the status bar.
"""
from __future__ import annotations

import re

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QCheckBox, QComboBox, QLabel, QSpinBox, QToolBar, QToolButton
from superqt.utils import signals_blocked

from attn_explorer.gui.widgets.heatmap import COLORMAPS
from attn_explorer.session.jobs import dtype_error_job

DTYPES = ("float32", "bfloat16", "float16")  # the weights' number formats load_model reads
OPEN_FOLDER = "Open model folder…"
HF_ID = "Hugging Face id…"
# the built-in models' descriptions open with "text, trained:" or "image, untrained:"
KIND = re.compile(r"^(text|image), (trained|untrained):\s*")


def model_item_text(name: str, description: str) -> str:
    """The picker's line for a built-in model: its name, kind (text or image) and whether it is trained."""
    m = KIND.match(description)
    return f"{name} — {m.group(1)}, {m.group(2)}" if m else name


class ViewToolbar:
    """The toolbar of `window` (a MainWindow: statusBar, show_error, focus_page, file_actions) over `state`."""

    def __init__(self, window, state) -> None:
        self.window, self.state = window, state
        tb = QToolBar("View")
        tb.setObjectName("view-toolbar")
        tb.setMovable(False)
        window.addToolBar(tb)
        self.model_combo = QComboBox()
        self.model_combo.setMinimumWidth(200)
        self.model_combo.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        self.model_combo.setToolTip("Choose a model: built-in, a folder, or a Hugging Face id")
        self.fill_models([])
        self.model_combo.activated.connect(self.model_chosen)
        self.dtype_combo = QComboBox()
        self.dtype_combo.setObjectName("dtype")
        self.dtype_combo.addItems(DTYPES)
        self.dtype_combo.setCurrentText(self.state.dtype)
        self.dtype_combo.setToolTip("Number format of the weights: float32 is exact; bfloat16 and float16 take half "
                                    "the memory and round a little. Choosing one loads the model again")
        self.dtype_combo.activated.connect(lambda i: self.choose_dtype(self.dtype_combo.itemText(i)))
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

    # ------------------------------------------------------------------------------- model picker
    def fill_models(self, builtins) -> None:
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
            self.select_model_item(current)

    def choose_dtype(self, name: str) -> None:
        """A dtype chosen in the picker (or by the status line's bfloat16 offer): show it and load the model in it."""
        with signals_blocked(self.dtype_combo):
            self.dtype_combo.setCurrentText(name)
        self.state.set_dtype(name)

    def _show_dtype(self) -> None:
        """The dtype picker shows what the loaded model uses (a failed reload leaves the old one)."""
        with signals_blocked(self.dtype_combo):
            self.dtype_combo.setCurrentText(self.state.info.dtype if self.state.info else self.state.dtype)

    # ------------------------------------------------------------------------------- error vs float32
    DTYPE_ERROR_TIP = ("How far this 16-bit model's maps and last hidden state are from float32 on the current "
                       "input: runs it once more next to the checkpoint loaded in float32")

    def _build_dtype_error(self) -> None:
        """The "Error vs float32" button (and View menu entry), and its read-out in the status bar."""
        self.act_dtype_error = QAction("Error vs float32", self.window)
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
        self.window.statusBar().addPermanentWidget(self.dtype_error_label)
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
        self.window.show_error(f"error vs float32: {message}")
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
        return f"{info.name} — {info.modality}, {info.weights or ('trained' if info.trained else 'untrained')}"

    def select_model_item(self, name: str) -> None:
        i = self.model_combo.findData(name)
        if i < 0:
            self.model_combo.insertItem(0, self._loaded_item_text(), name)
            i = 0
        elif self.state.info is not None and self.state.info.name == name:
            self.model_combo.setItemText(i, self._loaded_item_text())  # what loading it showed
        with signals_blocked(self.model_combo):
            self.model_combo.setCurrentIndex(i)

    def model_chosen(self, index: int) -> None:
        data = self.model_combo.itemData(index)
        if data == OPEN_FOLDER:
            self.window.file_actions.open_model_folder_dialog()
        elif data == HF_ID:
            self.window.file_actions.hf_id_dialog()
        elif data:
            self.state.choose_model(data)  # the model loaded already: nothing to do
        if self.state.info is not None:
            self.select_model_item(self.state.info.name)
        self.window.focus_page()  # the arrows step layers and heads again, not through the model list

    # ------------------------------------------------------------------------------- state -> toolbar
    def show_selection(self, layer: int, head: int) -> None:
        for spin, v in ((self.layer_spin, layer), (self.head_spin, head)):
            with signals_blocked(spin):
                spin.setValue(v)

    def show_options(self) -> None:
        st = self.state
        with signals_blocked(self.cmap_combo, self.scale_combo, self.hide_special_box):
            self.cmap_combo.setCurrentText(st.colormap)
            self.scale_combo.setCurrentText("log" if st.log_scale else "linear")
            self.hide_special_box.setChecked(st.hide_special)
        self.sync_ranges()  # an encoder-decoder's stack switch: the decoder's layers and heads

    def sync_ranges(self) -> None:
        """Layer and head spin boxes span the stack shown (state.stack_shape)."""
        L, H = self.state.stack_shape()
        for spin, top, val in ((self.layer_spin, L, self.state.layer), (self.head_spin, H, self.state.head)):
            if top:
                with signals_blocked(spin):
                    spin.setRange(0, top - 1)
                    spin.setValue(val)
