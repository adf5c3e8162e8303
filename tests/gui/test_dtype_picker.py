"""The toolbar's dtype picker: choosing bfloat16 loads the model again in bfloat16 and every label says so;
a reload that fails leaves the picker on the dtype still in use."""
from __future__ import annotations

import argparse

from attn_explorer.errors import UserError
from attn_explorer.session.jobs import default_loader


def _window(qtbot, settings, loader, dtype="float32"):
    from attn_explorer.gui.window.app import build_window, get_qapp

    get_qapp()
    args = argparse.Namespace(model="textbook", text="the cat sat on the mat", image=None, device="cpu", view=None,
                              screenshot=None, dtype=dtype)
    w, state = build_window(args, settings=settings, loader=loader)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=60000)
    return w, state


def _pick(w, name):
    i = w.dtype_combo.findText(name)
    w.dtype_combo.setCurrentIndex(i)
    w.dtype_combo.activated.emit(i)  # what a click on the item sends


def test_picking_a_dtype_reloads_the_model_in_it(qtbot, settings):
    w, state = _window(qtbot, settings, default_loader)
    assert w.dtype_combo.currentText() == "float32" and state.info.dtype == "float32"
    with qtbot.waitSignal(state.model_loaded, timeout=60000) as got:
        _pick(w, "bfloat16")
    assert got.args[0].dtype == "bfloat16"
    qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=60000)
    assert w.dtype_combo.currentText() == "bfloat16"
    assert w.status_labels["device"].text() == "cpu · bfloat16"
    assert state.result.attentions.dtype.name == "float32"  # maps reach the GUI as float32
    w.state.shutdown()


def test_the_window_starts_in_the_dtype_of_the_command_line(qtbot, settings):
    w, state = _window(qtbot, settings, default_loader, dtype="float16")
    assert state.info.dtype == "float16" and w.dtype_combo.currentText() == "float16"
    assert "L·H·n²·2 B" in w.seq_panel.readout.text()  # a 16-bit model keeps its maps at 2 bytes an element
    w.state.shutdown()


def test_a_reload_that_fails_leaves_the_picker_on_the_dtype_in_use(qtbot, settings):
    def loader(src, device="auto", progress=None, want_image=False, dtype="float32"):
        if dtype == "float16":
            raise UserError("float16 refused here")
        return default_loader(src, device=device, progress=progress, want_image=want_image, dtype=dtype)

    w, state = _window(qtbot, settings, loader)
    with qtbot.waitSignal(state.error_raised, timeout=60000):
        _pick(w, "float16")
    assert w.dtype_combo.currentText() == "float32" and state.dtype == "float32"
    assert state.info.dtype == "float32"
    w.state.shutdown()
