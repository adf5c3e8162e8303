"""The toolbar's dtype picker: choosing bfloat16 loads the model again in bfloat16 and every label says so;
a reload that fails leaves the picker on the dtype still in use."""
from __future__ import annotations


from attn_explorer.errors import UserError
from attn_explorer.session.jobs import default_loader




def _pick(w, name):
    i = w.dtype_combo.findText(name)
    w.dtype_combo.setCurrentIndex(i)
    w.dtype_combo.activated.emit(i)  # what a click on the item sends


def test_picking_a_dtype_reloads_the_model_in_it(qtbot, dtype_window):
    w, state = dtype_window("float32", default_loader)
    assert w.dtype_combo.currentText() == "float32" and state.info.dtype == "float32"
    with qtbot.waitSignal(state.model_loaded, timeout=60000) as got:
        _pick(w, "bfloat16")
    assert got.args[0].dtype == "bfloat16"
    qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=60000)
    assert w.dtype_combo.currentText() == "bfloat16"
    assert w.status_labels["device"].text() == "cpu · bfloat16"
    assert state.result.attentions.dtype.name == "float32"  # maps reach the GUI as float32
    w.state.shutdown()


def test_the_window_starts_in_the_dtype_of_the_command_line(qtbot, dtype_window):
    w, state = dtype_window("float16", default_loader)
    assert state.info.dtype == "float16" and w.dtype_combo.currentText() == "float16"
    assert "L·H·n²·2 B" in w.seq_panel.readout.text()  # a 16-bit model keeps its maps at 2 bytes an element
    w.state.shutdown()


def test_a_reload_that_fails_leaves_the_picker_on_the_dtype_in_use(qtbot, dtype_window):
    def loader(src, device="auto", progress=None, want_image=False, dtype="float32"):
        if dtype == "float16":
            raise UserError("float16 refused here")
        return default_loader(src, device=device, progress=progress, want_image=want_image, dtype=dtype)

    w, state = dtype_window("float32", loader)
    with qtbot.waitSignal(state.error_raised, timeout=60000):
        _pick(w, "float16")
    assert w.dtype_combo.currentText() == "float32" and state.dtype == "float32"
    assert state.info.dtype == "float32"
    w.state.shutdown()
