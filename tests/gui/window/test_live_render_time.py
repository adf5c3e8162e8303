"""The status bar's "render" is the GUI's share: from a result reaching the GUI thread to its paint. A long run's
partial results (issue 24 C: the grid fills layer by layer) came without a new start time, so the time was taken
from the last whole run's arrival: a real window said "render 39748.4 ms" while Gemma 3 ran (the forward so far,
not the paint). Each part is timed from its own arrival."""
from __future__ import annotations

import argparse
import time

import pytest

pytest.importorskip("transformers")

from tests.gui.conftest import cached_loader  # noqa: E402
from tests.gui.explorer.test_live_zoom import TEXT, folder  # noqa: E402,F401 (the module's folder fixture)


def test_a_partial_results_render_time_is_its_own_paint(qtbot, settings, folder, monkeypatch):  # noqa: F811
    from attn_explorer.api import model as api_model
    from attn_explorer.core import progress
    from attn_explorer.gui.window.app import build_window, get_qapp
    from attn_explorer.session.live_run import incomplete

    monkeypatch.setattr(api_model, "DENSE_MAX_BYTES", 0)  # every run lazy: parts arrive as layers finish
    slow = {"s": 0.0}
    plain = progress.layer_done

    def slowed(*a, **kw):
        time.sleep(slow["s"])
        plain(*a, **kw)

    monkeypatch.setattr(progress, "layer_done", slowed)
    get_qapp()
    args = argparse.Namespace(model=folder, text="Hello there.", image=None, device="cpu", view="grid",
                              screenshot=None)
    window, state = build_window(args, settings=settings, loader=cached_loader)
    qtbot.addWidget(window)
    window.resize(1300, 850)
    window.show()
    try:
        qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=60000)
        slow["s"] = 0.8  # about 5 s a forward: layer 2's part arrives 2 s and more after the run began
        state.set_text(TEXT)
        qtbot.waitUntil(lambda: state.result is not None and incomplete(state.result) != ""
                        and state.result.lazy.done >= 3, timeout=20000)
        painted = []
        window.frame_painted.connect(painted.append)
        qtbot.waitUntil(lambda: bool(painted), timeout=5000)  # the next part's paint
        assert painted[-1] < 1500.0, f"render {painted[-1]:.0f} ms counts the forward, not the paint"
        assert "render" in window.status_labels["render"].text()
    finally:
        slow["s"] = 0.0
        state.shutdown()
