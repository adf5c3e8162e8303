"""Issue 24 B in a real window: after a long float32 run on a CPU with native bfloat16, the status line offers
bfloat16 with its estimate ("about X s instead of Y s") and a one-click switch that goes through the dtype picker;
nothing switches by itself; no offer for a short input, a CPU without bf16, or a model already in bfloat16; a new
input, a model switch or a dtype change takes the offer away.

The thresholds are lowered and the estimate stubbed (session.bf16_offer) so that the textbook model's few tokens
count as long and the answer does not depend on this machine's speed; one test runs the real estimate job."""
from __future__ import annotations

import pytest

from attn_explorer.session import bf16_offer as bo

LONG_TEXT = " ".join(["the cat sat on the mat and looked at the dog"] * 4)  # ~45 tokens
SHORT_TEXT = "the cat sat"


def _stub_estimate(model, tokens, forward_s):
    return {"native": True, "f32_s": forward_s, "bf16_s": 0.4 * forward_s, "ratio": 0.4, "tokens": tokens,
            "products_ratio": 0.3, "attn_ratio": 0.6, "share": 0.85}


@pytest.fixture
def offered(monkeypatch):
    monkeypatch.setattr(bo, "LONG_TOKENS", 30)
    monkeypatch.setattr(bo, "LONG_FORWARD_S", 0.0)
    monkeypatch.setattr(bo, "estimate_job", _stub_estimate)


def _settled(qtbot, state):
    qtbot.waitUntil(lambda: state.result is not None and not state.busy and not state.job_busy(bo.LANE),
                    timeout=60000)


def _long_run(qtbot, w, state):
    state.set_text(LONG_TEXT)
    qtbot.waitUntil(lambda: state.result is not None and state.result.num_tokens >= 30 and not state.busy,
                    timeout=60000)
    _settled(qtbot, state)


def test_a_long_float32_run_offers_bfloat16_and_nothing_switches_by_itself(qtbot, dtype_window, offered):
    w, state = dtype_window("float32")
    w.resize(1300, 850)
    _settled(qtbot, state)
    assert not w.run_line.offer_label.isVisible()  # the first text is short
    _long_run(qtbot, w, state)
    qtbot.waitUntil(lambda: w.run_line.offer_label.isVisible(), timeout=10000)
    line = w.run_line.offer.line
    assert line.startswith("bfloat16 would take about ") and " instead of " in line
    assert "estimated" in line and "vs float32" in line
    assert w.run_line.offer_label.text() in w.run_line.offer.variants  # as much of it as fits the window
    assert line in w.run_line.offer_label.toolTip()
    assert w.run_line.offer_button.isVisible() and w.run_line.offer_button.text() == "Switch to bfloat16"
    assert w.run_line.isVisible() and not w.run_line.stop_button.isVisible() and not w.run_line.bar.isVisible()
    qtbot.wait(300)
    assert state.info.dtype == "float32" and w.dtype_combo.currentText() == "float32"  # offered, not done
    w.state.shutdown()


def test_a_narrow_window_shows_a_shorter_offer_and_the_whole_button(qtbot, dtype_window, offered):
    w, state = dtype_window("float32")
    _long_run(qtbot, w, state)
    qtbot.waitUntil(lambda: w.run_line.offer_label.isVisible(), timeout=10000)
    for width in (1920, 1024):
        w.resize(width, 700)
        qtbot.wait(100)
        label, button = w.run_line.offer_label, w.run_line.offer_button
        shown = label.text()
        assert shown in w.run_line.offer.variants, (width, shown)  # not cut mid-word
        assert label.fontMetrics().horizontalAdvance(shown) <= label.width()
        assert ("about" in shown or "≈" in shown) and " s" in shown  # the estimate, always
        assert button.text() in ("Switch to bfloat16", "Switch")  # whole, never "itch to bfloa"
        assert button.width() >= button.sizeHint().width()
    w.state.shutdown()


def test_clicking_the_offer_switches_the_picker_and_reloads_in_bfloat16(qtbot, dtype_window, offered):
    w, state = dtype_window("float32")
    _long_run(qtbot, w, state)
    qtbot.waitUntil(lambda: w.run_line.offer_button.isVisible(), timeout=10000)
    with qtbot.waitSignal(state.model_loaded, timeout=60000) as got:
        w.run_line.offer_button.click()
    assert got.args[0].dtype == "bfloat16"
    assert w.dtype_combo.currentText() == "bfloat16" and state.dtype == "bfloat16"
    assert not w.run_line.offer_label.isVisible()
    _settled(qtbot, state)
    assert w.status_labels["device"].text() == "cpu · bfloat16"
    assert not w.run_line.offer_label.isVisible()  # the model is bfloat16 now: nothing to offer
    w.state.shutdown()


def test_no_offer_for_a_short_input(qtbot, dtype_window, offered):
    w, state = dtype_window("float32")
    state.set_text(SHORT_TEXT)
    qtbot.waitUntil(lambda: state.result is not None and state.result.num_tokens < 30 and not state.busy,
                    timeout=60000)
    _settled(qtbot, state)
    qtbot.wait(200)
    assert not w.run_line.offer_label.isVisible() and not w.run_line.isVisible()
    w.state.shutdown()


def test_no_offer_where_the_cpu_has_no_native_bf16(qtbot, dtype_window, monkeypatch):
    import attn_explorer.core.bf16 as core_bf16

    monkeypatch.setattr(bo, "LONG_TOKENS", 30)
    monkeypatch.setattr(bo, "LONG_FORWARD_S", 0.0)
    monkeypatch.setattr(core_bf16, "native_bf16", lambda: False)  # the real job, on a CPU without bf16
    w, state = dtype_window("float32")
    _long_run(qtbot, w, state)
    qtbot.wait(300)
    assert not w.run_line.offer_label.isVisible()
    w.state.shutdown()


def test_no_offer_when_the_model_is_bfloat16_already(qtbot, dtype_window, offered):
    w, state = dtype_window("bfloat16")
    _long_run(qtbot, w, state)
    qtbot.wait(300)
    assert state.info.dtype == "bfloat16" and not w.run_line.offer_label.isVisible()
    w.state.shutdown()


def test_a_new_input_or_a_model_switch_takes_the_offer_away(qtbot, dtype_window, offered, monkeypatch):
    w, state = dtype_window("float32")
    _long_run(qtbot, w, state)
    qtbot.waitUntil(lambda: w.run_line.offer_label.isVisible(), timeout=10000)
    state.set_text(LONG_TEXT + " again")  # a new input: the offer described the old one's forward
    assert not w.run_line.offer_label.isVisible()
    _settled(qtbot, state)
    qtbot.waitUntil(lambda: w.run_line.offer_label.isVisible(), timeout=10000)  # and the new run's own offer
    state.load_model("textbook-nopos")  # a model switch
    assert not w.run_line.offer_label.isVisible()
    qtbot.waitUntil(lambda: state.info.name == "textbook-nopos", timeout=60000)
    w.state.shutdown()


def test_the_real_estimate_job_runs_off_the_gui_thread(qtbot, dtype_window, monkeypatch):
    import threading

    import attn_explorer.core.bf16 as core_bf16

    monkeypatch.setattr(bo, "LONG_TOKENS", 30)
    monkeypatch.setattr(bo, "LONG_FORWARD_S", 0.0)
    monkeypatch.setattr(core_bf16, "native_bf16", lambda: True)
    seen = {}
    real = bo.estimate_job

    def spy(model, tokens, forward_s):
        seen["thread"] = threading.current_thread() is threading.main_thread()
        seen["answer"] = real(model, tokens, forward_s)
        return seen["answer"]

    monkeypatch.setattr(bo, "estimate_job", spy)
    w, state = dtype_window("float32")
    _long_run(qtbot, w, state)
    qtbot.waitUntil(lambda: "answer" in seen, timeout=30000)
    assert seen["thread"] is False and seen["answer"]["native"]
    d = seen["answer"]  # shown only where it pays (on the textbook model's tiny products it may not)
    qtbot.wait(200)
    assert w.run_line.offer_label.isVisible() == (d["bf16_s"] <= bo.PAYS * d["f32_s"])
    w.state.shutdown()
