"""Issue 24 D in a real window: while a long run is in flight the status bar says what runs (model, tokens,
layer k of L, elapsed, an estimate) and the grid's header marks the maps drawn as the previous input's, until
the new maps arrive; Stop (Esc) and a model switch end the forward within a second, and the last good view
stays. The long forward: a tiny random Llama of 40 layers whose every layer a hook slows down."""
from __future__ import annotations

import argparse
import time

import pytest

pytest.importorskip("transformers")

from PySide6.QtCore import Qt  # noqa: E402

from tests.gui.conftest import cached_loader  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

LAYERS = 40


@pytest.fixture(scope="module")
def deep_folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("deep") / "deep", num_hidden_layers=LAYERS))


@pytest.fixture
def long_window(qtbot, settings, deep_folder):
    import attn_explorer as ax
    from attn_explorer.gui.window.app import build_window, get_qapp
    from attn_explorer.session.jobs import Loaded

    slow = {"s": 0.0, "calls": 0, "last": 0.0}

    def hook(x, name):
        slow["calls"] += 1
        slow["last"] = time.perf_counter()
        time.sleep(slow["s"])
        return x

    def loader(src, device="cpu", progress=None, want_image=False):
        if src != deep_folder:
            return cached_loader(src, device, progress, want_image)
        m = ax.load_model(deep_folder, device="cpu")
        ctx = m.hooks({f"blocks.{i}.hook_resid_post": hook for i in range(LAYERS)})
        ctx.__enter__()  # every run of it is slow
        slow.setdefault("contexts", []).append(ctx)  # held: a collected context manager would take its hooks off
        return Loaded(model=m, info=m.info, builtins=list(ax.builtin_models()))

    get_qapp()
    args = argparse.Namespace(model=deep_folder, text="The capital of France is Paris.", image=None, device="cpu",
                              view=None, screenshot=None)
    window, state = build_window(args, settings=settings, loader=loader)
    qtbot.addWidget(window)
    window.resize(1300, 850)
    window.show()
    qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=60000)
    yield window, state, slow
    slow["s"] = 0.0
    state.shutdown()


def _start_slow_edit(qtbot, window, state, slow):
    slow["s"] = 0.25  # 10 s a forward
    before = state.result
    state.set_text("The capital of Italy is Rome, and the capital of Spain is Madrid.")
    qtbot.waitUntil(lambda: (state.run_status() or {}).get("layer", 0) >= 2, timeout=10000)
    return before


def test_a_long_run_is_described_and_the_old_maps_are_marked(qtbot, long_window):
    window, state, slow = long_window
    from attn_explorer.gui.explorer.grid_view import PREVIOUS, HeadGridView

    grid = window.findChild(HeadGridView)
    assert PREVIOUS not in grid.title.text()
    before = _start_slow_edit(qtbot, window, state, slow)
    qtbot.waitUntil(lambda: window.run_line.isVisible(), timeout=3000)
    line = window.run_line.label.text()
    name = state.info.name
    assert line.startswith(f"running {name}: ") and f"of {LAYERS}" in line and "tokens" in line
    assert "left" in line and " s" in line  # elapsed and an estimate
    assert window.run_line.bar.maximum() == LAYERS and 2 <= window.run_line.bar.value() < LAYERS
    assert PREVIOUS in grid.title.text() and state.result is before
    slow["s"] = 0.0  # let it finish: the new maps arrive and the mark goes
    qtbot.waitUntil(lambda: state.result is not before and not state.busy, timeout=30000)
    assert PREVIOUS not in grid.title.text()
    qtbot.waitUntil(lambda: not window.run_line.isVisible(), timeout=3000)


def test_esc_stops_the_forward_within_a_second_and_keeps_the_view(qtbot, long_window):
    window, state, slow = long_window
    before = _start_slow_edit(qtbot, window, state, slow)
    asked = time.perf_counter()
    qtbot.keyClick(window, Qt.Key_Escape)
    qtbot.waitUntil(lambda: not state.busy, timeout=5000)
    calls = slow["calls"]
    qtbot.wait(600)
    assert slow["calls"] == calls  # no layer ran after the stop
    assert slow["last"] - asked < 1.0
    assert state.result is before  # the last good view stays
    assert not window.run_line.isVisible()


def test_a_model_switch_during_a_long_forward_stops_it_within_a_second(qtbot, long_window):
    window, state, slow = long_window
    _start_slow_edit(qtbot, window, state, slow)
    asked = time.perf_counter()
    state.choose_model("textbook")
    qtbot.waitUntil(lambda: state.info.name == "textbook" and state.result is not None
                    and state.result.model == "textbook", timeout=30000)
    assert slow["last"] - asked < 1.0, f"the old forward ran on for {slow['last'] - asked:.2f} s"


def test_a_first_run_after_an_empty_box_is_not_described_as_waiting_for_text(qtbot, long_window):
    """The box was emptied (the page asks for text); a long text is pasted: while it runs, the page says what
    runs, not "type or paste some text", and the status bar does not say "ready"."""
    window, state, slow = long_window
    from attn_explorer.gui.explorer.grid_view import HeadGridView

    grid = window.findChild(HeadGridView)
    state.set_text("")
    qtbot.waitUntil(lambda: "type or paste" in grid.stack.placeholder.text() and not state.busy, timeout=5000)
    slow["s"] = 0.25
    state.set_text("The capital of Italy is Rome, and the capital of Spain is Madrid.")
    qtbot.waitUntil(lambda: (state.run_status() or {}).get("layer", 0) >= 2, timeout=10000)
    qtbot.wait(100)
    shown = grid.stack.placeholder.text()
    assert "type or paste" not in shown and shown.lower().startswith("running"), shown
    assert window.statusBar().currentMessage() != "ready"
    slow["s"] = 0.0
    qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=30000)
