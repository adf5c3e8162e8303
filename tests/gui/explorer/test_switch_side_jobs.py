"""Issue 24 D in the window: a model switch ends the old model's side jobs. A long (lazy) run of a tiny Llama is
on the head page; its pooled views (the whole map pooled to the screen, the zoomed window, the query's strip)
are asked of the worker lanes, from the old run's q and k, and each takes long (every exact map request of the
lazy store is slowed, checking for a stop between its "tiles" as core.lazy does). Choosing another model ends
every one of them within a second, and none of their answers is drawn over the new model's maps."""
from __future__ import annotations

import argparse
import threading
import time

import pytest

pytest.importorskip("transformers")

from tests.gui.conftest import cached_loader  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = ("The capital of France is Paris. Attention lets every token look at the tokens before it. "
        "A small model with random weights still attends to something: often the first token.")
TILES, TILE_S = 200, 0.05  # 10 s a request


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("side") / "side"))


def test_a_model_switch_ends_the_old_runs_pooled_views(qtbot, settings, folder, monkeypatch):
    from attn_explorer.api import model as api_model
    from attn_explorer.api.lazy import LazyAttention
    from attn_explorer.core import progress
    from attn_explorer.gui.window.app import build_window, get_qapp
    from attn_explorer.session.long_view import STRIP_LANE, WINDOW_LANE, result_tag

    monkeypatch.setattr(api_model, "DENSE_MAX_BYTES", 0)  # the tiny Llama's run is lazy: drawn windowed
    get_qapp()
    args = argparse.Namespace(model=folder, text=TEXT, image=None, device="cpu", view="head", screenshot=None)
    window, state = build_window(args, settings=settings, loader=cached_loader)
    qtbot.addWidget(window)
    window.resize(1300, 850)
    window.show()
    hv = window.head_view
    lanes = (WINDOW_LANE, WINDOW_LANE + ":whole", STRIP_LANE)
    try:
        qtbot.waitUntil(lambda: state.result is not None and state.result.is_lazy and not state.busy
                        and hv.long_map.base is not None and not any(state.job_busy(k) for k in lanes),
                        timeout=60000)
        old = state.result.lazy  # the old run's store: only its requests are slowed
        started, ended, lock = [], [], threading.Lock()
        plain = LazyAttention.attention

        def slow(self, *a, **kw):  # an exact request of the old run's store, tile by tile
            if self is not old:
                return plain(self, *a, **kw)
            with lock:
                started.append(time.perf_counter())
            try:
                for _ in range(TILES):
                    time.sleep(TILE_S)
                    progress.check()  # between tiles, as core.lazy's tiles check
                return plain(self, *a, **kw)
            finally:
                with lock:
                    ended.append(time.perf_counter())

        monkeypatch.setattr(LazyAttention, "attention", slow)
        hv.plot.setRange(xRange=(4, 20), yRange=(10, 22), padding=0)  # a zoom: the window lane asks
        state.set_query(12)  # the strip lane asks
        hv.long_map.ask_base(state.result, 0, 1)  # and the whole map again (as a resize asks it)
        qtbot.waitUntil(lambda: len(started) >= 2, timeout=10000)
        assert not ended
        asked = time.perf_counter()
        state.choose_model("textbook")
        qtbot.waitUntil(lambda: not any(state.job_busy(k) for k in lanes), timeout=5000)
        qtbot.waitUntil(lambda: len(ended) == len(started), timeout=5000)
        assert max(ended) - asked < 1.0, f"the old run's pooled views ran on for {max(ended) - asked:.2f} s"
        qtbot.waitUntil(lambda: state.result is not None and state.result.model == "textbook" and not state.busy,
                        timeout=30000)
        qtbot.wait(300)
        assert len(started) == len(ended)  # none started again for the old run
        for win in (hv.long_map.window, hv.long_map.base):  # no answer of the old run's was drawn late
            assert win is None or win.ask.tag == result_tag(state.result)
    finally:
        state.shutdown()
