"""The Head overview and Rollout pages on a long input's result (no maps kept, only each layer's q, k and lse):
they compute in a worker with a progress bar that reaches 100 %, can be cancelled, and show the same numbers
the dense pages would.

The long result is the window's own input run again on its tiny random Llama with Model.run(lazy=True), so
the expected numbers are the dense statistics and rollout of the window's run."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from attn_explorer.analysis import long
from attn_explorer.analysis.rollout import attention_rollout
from attn_explorer.analysis.stats import head_stats
from tests.tiny_llama import make_llama_folder

TEXT = " ".join(["Attention lets every token look at the tokens before it."] * 4)


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("llama"), seed=4, initializer_range=0.3))


def _show_long(w, qtbot):
    """Replace the window's dense result by the same input run lazily (q, k and lse kept, no maps), as a long
    input's would be."""
    st = w.state
    dense = st.result
    lazy = st._model.run(TEXT, lazy=True)
    assert lazy.is_lazy and lazy.num_tokens == dense.num_tokens
    st.result = lazy
    st.attention_ready.emit(lazy)
    return dense, lazy


@pytest.fixture
def many_tiles(monkeypatch):
    """One query row a tile, each reported."""
    monkeypatch.setattr(long, "TILE_ELEMENTS", 1)
    monkeypatch.setattr(long, "PROGRESS_EVERY_S", 0.0)


@pytest.fixture
def held(monkeypatch):
    """hold() makes the next job wait after its first progress report until the test lets it go on, so a
    cancel surely lands half-way (no race with a fast job)."""
    gate, step = {"event": None}, long._Reporter.step

    def waiting_step(self, label):
        step(self, label)
        if gate["event"] is not None:
            assert gate["event"].wait(30)

    monkeypatch.setattr(long._Reporter, "step", waiting_step)

    def hold():
        gate["event"] = threading.Event()
        return gate["event"]

    yield hold
    if gate["event"] is not None:
        gate["event"].set()


def test_overview_of_a_long_input_shows_progress_and_the_dense_numbers(make_window, qtbot, llama_folder, many_tiles):
    w = make_window(model=llama_folder, text=TEXT, view="overview")
    page = w.pages["overview"]
    qtbot.waitUntil(lambda: page.stats is not None, timeout=30000)
    dense, lazy = _show_long(w, qtbot)
    assert page.stats is None and page.progress.isVisible() and page.progress.button.text() == "Cancel"
    assert "Measuring every head" in page.progress.label.text() and "No maps were kept" in page.stack.placeholder.text()
    qtbot.waitUntil(lambda: page.stats is not None, timeout=30000)
    assert page.progress.fraction == 1.0 and not page.progress.isVisible()
    want = head_stats(dense.attentions, dense.special)
    for name in ("entropy", "sink", "distance", "prev", "next"):
        np.testing.assert_allclose(page.stats.get(name), want.get(name), atol=1e-5, err_msg=name)
    assert "in tiles from each layer's q and k" in page.caption.text()
    # Hide specials redraws the same run (a new record sharing its store): nothing long is measured again
    stats = page.stats
    w.state.set_options(hide_special=True)
    qtbot.waitUntil(lambda: w.state.result is not lazy, timeout=30000)
    assert w.state.result.lazy is lazy.lazy and page.stats is stats and page._for is w.state.result
    assert not w.state.job_busy("analysis-overview") and not page.progress.isVisible()


def test_overview_of_a_long_input_can_be_cancelled_and_started_again(make_window, qtbot, llama_folder, many_tiles,
                                                                      held):
    w = make_window(model=llama_folder, text=TEXT, view="overview")
    page = w.pages["overview"]
    qtbot.waitUntil(lambda: page.stats is not None, timeout=30000)
    go_on = held()
    _show_long(w, qtbot)
    qtbot.waitUntil(lambda: page.progress.fraction > 0, timeout=30000)
    page.progress.button.click()
    go_on.set()
    assert page.progress.button.text() == "Measure again" and not page.progress.bar.isVisible()
    assert "stopped" in page.stack.placeholder.text() and page.caption.text() == ""
    qtbot.waitUntil(lambda: not w.state.job_busy("analysis-overview"), timeout=30000)
    assert page.stats is None  # the stopped job's answer never arrives
    w.state.set_options(log_scale=True)
    assert page.stats is None and not w.state.job_busy("analysis-overview")  # a redraw does not restart it
    page.progress.button.click()
    assert page.progress.button.text() == "Cancel"
    qtbot.waitUntil(lambda: page.stats is not None, timeout=30000)
    assert page.progress.fraction == 1.0


def test_rollout_of_a_long_input_is_the_dense_rollouts_row(make_window, qtbot, llama_folder, many_tiles, held):
    w = make_window(model=llama_folder, text=TEXT, view="rollout")
    page = w.pages["rollout"]
    qtbot.waitUntil(lambda: page.shown is not None, timeout=30000)
    dense, lazy = _show_long(w, qtbot)
    assert page.progress.isVisible()
    qtbot.waitUntil(lambda: page.row is not None, timeout=30000)
    q = w.state.query
    np.testing.assert_allclose(page.row, attention_rollout(dense.attentions)[q], atol=1e-5)
    assert page.progress.fraction == 1.0 and page.panel.matrix.shape == (1, lazy.num_tokens)
    assert f"token {q}" in page.caption.text()
    row = page.row
    w.state.set_options(hide_special=True)  # a redraw of the same run: the row is not rolled out again
    qtbot.waitUntil(lambda: w.state.result is not lazy, timeout=30000)
    assert page.row is row and not w.state.job_busy("analysis-rollout") and not page.progress.isVisible()
    w.state.set_options(hide_special=False)
    qtbot.waitUntil(lambda: not w.state.busy, timeout=30000)
    # another query: a new row, and the bar goes again; stopping it leaves nothing stale on screen
    go_on = held()
    w.state.set_query(3)
    assert page.row is None and page.progress.button.text() == "Cancel"
    qtbot.waitUntil(lambda: page.progress.fraction > 0, timeout=30000)
    page.progress.button.click()
    go_on.set()
    assert page.row is None and "stopped" in page.stack.placeholder.text()
    qtbot.waitUntil(lambda: not w.state.job_busy("analysis-rollout"), timeout=30000)
    page.progress.button.click()
    qtbot.waitUntil(lambda: page.row is not None, timeout=30000)
    np.testing.assert_allclose(page.row, attention_rollout(dense.attentions)[3], atol=1e-5)
    # discarding needs whole maps: said on the page, nothing computed
    page.discard.setValue(0.2)
    assert page.row is None and "discard lowest to 0" in page.stack.placeholder.text()
    assert not w.state.job_busy("analysis-rollout")
