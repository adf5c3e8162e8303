"""Issue 24 D in the window: after an edit that reused the prefix (a causal model's long run, kept lazily), the
grid's overview recomputes only the rows from the edit on, not every head from zero; what it draws equals a
full recompute."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

pytest.importorskip("transformers")

from tests.gui.conftest import cached_loader  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = ("The capital of France is Paris. Attention lets every token look at the tokens before it. "
        "A small model with random weights still attends to something: often the first token. ")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("llama") / "llama"))


def test_an_edit_with_a_reused_prefix_recomputes_only_the_changed_rows(qtbot, settings, folder, monkeypatch):
    from attn_explorer.api import model as api_model
    from attn_explorer.api.lazy import LazyAttention
    from attn_explorer.gui.explorer.grid_view import HeadGridView
    from attn_explorer.gui.window.app import build_window, get_qapp
    from attn_explorer.session.long_view import overview_job, reused_prefix

    monkeypatch.setattr(api_model, "DENSE_MAX_BYTES", 0)  # every run keeps q and k: the grid fills from them
    rows = []
    plain = LazyAttention.attention

    # every head's rows asked of a lazy store: the first run's fill as it runs (session.live_run) and the grid's
    # lane after an edit (session.long_view.overview_job) both ask here
    def counting(self, layer, head, rows_=None, cols=None, pool=None, *a, rows=None, **kw):
        span = rows if rows is not None else rows_
        lo, hi = (0, self.layers[0].n) if span is None else span
        counted.append(hi - lo)
        return plain(self, layer, head, span, cols, pool, *a, **kw)

    counted = rows
    monkeypatch.setattr(LazyAttention, "attention", counting)
    get_qapp()
    args = argparse.Namespace(model=folder, text=TEXT + "Q", image=None, device="cpu", view="grid",
                              screenshot=None)
    window, state = build_window(args, settings=settings, loader=cached_loader)
    qtbot.addWidget(window)
    window.show()
    grid = window.findChild(HeadGridView)
    try:
        qtbot.waitUntil(lambda: state.result is not None and state.result.is_lazy and not state.busy, timeout=60000)
        qtbot.waitUntil(lambda: grid.overview_state() == "" and grid._complete is not None, timeout=60000)
        first = sum(rows)
        n = state.result.num_tokens
        rows.clear()
        state.set_text(TEXT + "Z")
        qtbot.waitUntil(lambda: state.result is not None and "Z" in "".join(state.result.tokens)
                        and not state.busy, timeout=60000)
        r = state.result
        assert r.total_tokens == r.num_tokens  # nothing cut
        assert reused_prefix(r) > 0 and r.num_tokens == n, (r.reuse, r.num_tokens, n)
        qtbot.waitUntil(lambda: grid.overview_state() == "" and grid._complete is not None
                        and grid._complete[2] == list(r.tokens), timeout=60000)
        again = sum(rows)
        assert again < first / 4, (again, first)  # only the rows from the edit on
        rows.clear()
        full = None
        for full in overview_job(r):
            pass
        # the changed rows come from a tile of their own: equal to a full recompute up to float32 rounding
        np.testing.assert_allclose(grid._complete[0].weights, full[2].weights, rtol=1e-5, atol=1e-8)
    finally:
        state.shutdown()
