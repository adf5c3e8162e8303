"""The toolbar's "Error vs float32": for a 16-bit model it measures, once and on request, how far the maps
and last hidden state are from float32 on the current input; the read-out goes when the input changes,
and the button is off for a float32 model."""
from __future__ import annotations


from attn_explorer.errors import UserError




def test_error_vs_float32_names_both_errors_and_goes_when_the_text_changes(qtbot, dtype_window):
    w, state = dtype_window("bfloat16")
    assert state.info.dtype == "bfloat16"
    assert w.dtype_error_button.isVisible()  # the toolbar holds it at the test window's size
    assert w.dtype_error_button.isEnabled() and w.act_dtype_error in w.menuBar().actions()[1].menu().actions()
    w.dtype_error_button.click()
    assert w.dtype_error_label.text().startswith("measuring")
    assert not w.dtype_error_button.isEnabled()  # one measurement at a time
    qtbot.waitUntil(lambda: "maps ±" in w.dtype_error_label.text(), timeout=60000)
    label, tip = w.dtype_error_label.text(), w.dtype_error_button.toolTip()
    assert label.startswith("vs float32: maps ±") and "hidden ±" in label
    assert w.status_labels["device"].text() == "cpu · bfloat16"  # the dtype measured, next to the read-out
    assert "maps ±" in tip and "last hidden state ±" in tip and "float32" in tip
    maps = float(label.split("maps ±")[1].split(",")[0])
    assert 0 < maps < 0.1  # bfloat16 rounds: not zero, but small next to weights that sum to 1
    assert w.dtype_error_button.isEnabled()
    with qtbot.waitSignal(state.attention_ready, timeout=60000):
        state.set_text("a dog ran in the park")
    assert w.dtype_error_label.text() == "" and "maps ±" not in w.dtype_error_button.toolTip()
    state.shutdown()


def test_the_read_out_goes_when_d_k_changes_and_stays_for_a_redraw(qtbot, dtype_window):
    w, state = dtype_window("float16")
    assert w.measure_dtype_error()
    qtbot.waitUntil(lambda: "maps ±" in w.dtype_error_label.text(), timeout=60000)
    with qtbot.waitSignal(state.attention_ready, timeout=60000):
        state.set_options(hide_special=True)  # the same run, drawn again: the numbers still hold
    assert w.dtype_error_label.text().startswith("vs float32: maps ±")
    with qtbot.waitSignal(state.attention_ready, timeout=60000):
        state.set_dk_scale(4.0)
    assert w.dtype_error_label.text() == ""
    state.shutdown()


def test_the_button_is_off_for_a_float32_model_and_without_input(qtbot, dtype_window):
    w, state = dtype_window("float32")
    assert not w.dtype_error_button.isEnabled() and not w.act_dtype_error.isEnabled()
    assert not w.measure_dtype_error()
    w2, state2 = dtype_window("bfloat16")
    with qtbot.waitSignal(state2.input_cleared, timeout=60000):
        state2.set_text("   ")
    assert not w2.dtype_error_button.isEnabled()
    state.shutdown()
    state2.shutdown()


def test_a_failed_measurement_is_one_line_in_the_banner(qtbot, dtype_window, monkeypatch):
    w, state = dtype_window("bfloat16")

    def refuse(self, x, **kw):
        raise UserError("no float32 reference here")

    monkeypatch.setattr(type(state._model), "dtype_error", refuse)
    assert w.measure_dtype_error()
    qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=60000)
    assert "no float32 reference here" in w.banner.text and "\n" not in w.banner.text
    assert w.dtype_error_label.text() == "" and w.dtype_error_button.isEnabled()
    state.shutdown()


def test_the_read_out_goes_when_the_dtype_changes(qtbot, dtype_window):
    w, state = dtype_window("bfloat16")
    assert w.measure_dtype_error()
    qtbot.waitUntil(lambda: "maps ±" in w.dtype_error_label.text(), timeout=60000)
    i = w.dtype_combo.findText("float32")
    w.dtype_combo.setCurrentIndex(i)
    with qtbot.waitSignal(state.model_loaded, timeout=60000):
        w.dtype_combo.activated.emit(i)  # what a click on the item sends
    assert w.dtype_error_label.text() == "" and "maps ±" not in w.dtype_error_button.toolTip()
    assert not w.dtype_error_button.isEnabled()  # float32 now: nothing to compare
    state.shutdown()
