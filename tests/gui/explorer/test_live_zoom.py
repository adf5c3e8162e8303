"""Issue 24 C in the window: the one-head view of a finished layer can be opened and zoomed while later layers
run. A long (lazy) run on a 6-layer tiny Llama, every layer slowed (core.progress.layer_done sleeps, after the
layer's store went to the screen): while layer 0 is done and the later ones run, the head page shows layer 0,
opened then, its zoomed window is asked and drawn, it stays drawn as the next layers arrive (not cleared and asked again for
each part), and what it drew equals the finished run's map for that window. The later layers keep filling."""
from __future__ import annotations

import argparse
import time

import numpy as np
import pytest

pytest.importorskip("transformers")

from tests.gui.conftest import cached_loader  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

LAYERS = 6
TEXT = ("The capital of France is Paris. Attention lets every token look at the tokens before it. "
        "A small model with random weights still attends to something: often the first token.")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("live") / "live", num_hidden_layers=LAYERS))


def test_a_finished_layers_head_is_zoomed_while_later_layers_run(qtbot, settings, folder, monkeypatch):
    from attn_explorer.api import model as api_model
    from attn_explorer.core import progress
    from attn_explorer.gui.window.app import build_window, get_qapp
    from attn_explorer.gui.explorer import long_map
    from attn_explorer.session.live_run import incomplete

    monkeypatch.setattr(api_model, "DENSE_MAX_BYTES", 0)  # every run lazy: the head page draws it windowed
    slow = {"s": 0.0}
    plain, plain_job = progress.layer_done, long_map.window_job

    def slowed(*a, **kw):  # after the layer's store was handed on (on_kept): a long run in miniature
        time.sleep(slow["s"])
        plain(*a, **kw)

    monkeypatch.setattr(progress, "layer_done", slowed)
    get_qapp()
    args = argparse.Namespace(model=folder, text="Hello there.", image=None, device="cpu",
                              view="grid", screenshot=None)
    window, state = build_window(args, settings=settings, loader=cached_loader)
    qtbot.addWidget(window)
    window.resize(1300, 850)
    window.show()
    hv = window.head_view
    try:
        qtbot.waitUntil(lambda: state.result is not None and state.result.is_lazy and not state.busy, timeout=60000)
        state.select(layer=0, head=1)
        slow["s"] = 0.8  # about 5 s a forward
        state.set_text(TEXT)
        qtbot.waitUntil(lambda: state.result is not None and incomplete(state.result) != ""
                        and state.result.num_tokens > 30, timeout=20000)  # no prefix shared: a whole run, filled in)
        r = state.result
        n = r.num_tokens
        assert r.lazy.done < LAYERS
        window.show_page("head")  # opened while later layers run
        qtbot.waitUntil(lambda: hv.isVisible() and hv.long and hv.long_map.base is not None, timeout=10000)
        assert state.busy and incomplete(state.result)
        a, b, c, d = 10, 22, 4, 20
        hv.plot.setRange(xRange=(c, d), yRange=(a, b), padding=0)  # as a wheel zoom leaves it
        ask_seen = {}

        def zoomed():
            win = hv.long_map.window
            if win is None or win.ask.rows != (a, b) or win.ask.cols != (c, d):
                return False
            ask_seen["done"] = state.result.lazy.done
            return True

        qtbot.waitUntil(zoomed, timeout=10000)
        assert state.busy and incomplete(state.result), "the zoom came only after the forward"
        done = ask_seen["done"]
        tile = np.array(hv.image.image, copy=True)
        # the next layer arrives: the zoomed window stays drawn (not cleared and asked again)
        asked = []  # what the head page asks of the window lanes from now on: nothing, as later layers arrive
        monkeypatch.setattr(long_map, "window_job", lambda r_, ask: (asked.append(ask), plain_job(r_, ask))[1])
        assert done < LAYERS - 1, done
        qtbot.waitUntil(lambda: incomplete(state.result) and state.result.lazy.done > done, timeout=10000)
        qtbot.wait(200)
        assert state.busy
        assert asked == [], asked  # neither the base nor the zoomed window was asked again for the next parts
        assert hv.long_map.window is not None and hv.long_map.window.ask.rows == (a, b)
        assert hv.image.image is not None
        np.testing.assert_array_equal(hv.image.image, tile)
        slow["s"] = 0.0
        qtbot.waitUntil(lambda: not state.busy and incomplete(state.result) == "", timeout=30000)
        final = state.result
        assert final.num_tokens == n and final.lazy.num_layers == LAYERS  # the later layers filled in
        want = final.attention(0, 1, rows=(a, b), cols=(c, d))
        np.testing.assert_array_equal(tile, want)
        qtbot.waitUntil(lambda: hv.long_map.window is not None and hv.long_map.window.ask.rows == (a, b), timeout=10000)
        np.testing.assert_array_equal(hv.image.image, want)
        assert asked == [], asked
    finally:
        slow["s"] = 0.0
        state.shutdown()


@pytest.fixture
def filling(qtbot, settings, folder, monkeypatch):
    """(window, state): a window on the tiny Llama whose long (lazy) run of TEXT is filling in, a layer every
    0.8 s, its first layers on screen; every layer fast again at teardown."""
    from attn_explorer.api import model as api_model
    from attn_explorer.core import progress
    from attn_explorer.gui.window.app import build_window, get_qapp
    from attn_explorer.session.live_run import incomplete

    monkeypatch.setattr(api_model, "DENSE_MAX_BYTES", 0)
    slow = {"s": 0.0}
    plain = progress.layer_done

    def slowed(*a, **kw):
        time.sleep(slow["s"])
        plain(*a, **kw)

    monkeypatch.setattr(progress, "layer_done", slowed)
    get_qapp()
    args = argparse.Namespace(model=folder, text="Hello there.", image=None, device="cpu",
                              view="grid", screenshot=None)
    window, state = build_window(args, settings=settings, loader=cached_loader)
    qtbot.addWidget(window)
    window.show()
    try:
        qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=60000)
        slow["s"] = 0.8
        state.set_text(TEXT)
        qtbot.waitUntil(lambda: state.result is not None and incomplete(state.result) != ""
                        and state.result.num_tokens > 30, timeout=20000)
        yield window, state
    finally:
        slow["s"] = 0.0
        state.shutdown()


def test_a_switch_during_a_live_run_keeps_the_incomplete_mark(filling):
    """The grid keeps the old run's finished layers while another model loads and runs: its header still says
    they are incomplete (stopped), beside what is coming, not a plain header that reads as a whole run. While
    the run fills in, the status bar's time is the forward so far."""
    from attn_explorer.gui.explorer.grid_view import HeadGridView

    window, state = filling
    forward = window.status_labels["forward"].text()
    assert forward.startswith("forward so far "), forward  # the layers done so far, not a whole forward
    state.load_model("textbook")
    title = window.findChild(HeadGridView).title.text()
    assert "loading textbook" in title and "incomplete: layers 0–" in title and "(stopped)" in title, title


def test_an_edit_after_stop_takes_the_stop_banner_away_with_its_first_layer(qtbot, filling):
    """Stop says the finished layers stay; an edit starts a new run, and the first of its layers on screen
    takes that line away (it described the stopped run's layers, no longer shown)."""
    from attn_explorer.session.live_run import incomplete

    window, state = filling
    window.run_line.stop()
    qtbot.waitUntil(lambda: not state.busy, timeout=10000)
    assert window.banner.isVisible() and "stopped" in window.banner.text
    stopped = state.result
    state.set_text("A new beginning: " + TEXT)
    qtbot.waitUntil(lambda: state.result is not stopped and incomplete(state.result) != "", timeout=20000)
    assert not window.banner.isVisible(), window.banner.text
