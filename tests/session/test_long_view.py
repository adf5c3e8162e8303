"""The jobs behind the window at long inputs (session/long_view.py), on a lazy run of the tiny textbook model:
what each returns equals what RunResult.attention computes, the overview fills in head by head with its
progress, and the Go-to-token and colour-scale rules. No Qt."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.maths import pool_edges
from attn_explorer.session import long_view as lv

WORDS = "the cat sat on the mat because it was warm and the dog ran far away from home".split()


@pytest.fixture(scope="module")
def lazy_run():
    import inspect

    import attn_explorer as ax
    from attn_explorer.api.model import Model

    if "lazy" not in inspect.signature(Model.run).parameters:
        pytest.skip("Model.run(lazy=...) is not in this tree yet")
    m = ax.load_model("textbook", device="cpu")
    r = m.run(" ".join(WORDS[i % len(WORDS)] for i in range(300)), lazy=True)
    assert r.is_lazy
    return r


def test_window_job_pools_with_max_and_gives_each_cell_its_tokens(lazy_run):
    r = lazy_run
    ask = lv.visible_ask(r, 1, 2, (10.4, 250.2), (-3, 400), pixels=(100, 60))  # clamped, widened to tokens
    assert ask.rows == (0, 300) and ask.cols == (10, 251) and ask.cells == (100, 60) and not ask.full
    win = lv.window_job(r, ask)
    assert win.pooled and win.values.shape == (100, 60)
    full = r.attention(1, 2, rows=ask.rows, cols=ask.cols)
    a, b = 7, 13  # cell (7, 13) is the largest weight of the tokens its edges name
    block = full[win.row_edges[a]:win.row_edges[a + 1], win.col_edges[b] - 10:win.col_edges[b + 1] - 10]
    assert win.values[a, b] == pytest.approx(block.max())
    small = lv.visible_ask(r, 0, 3, (40, 60), (100, 110), pixels=(500, 500))
    assert small.full and lv.window_job(r, small).values.shape == (10, 20)
    np.testing.assert_array_equal(lv.window_job(r, small).values, r.attention(0, 3, rows=(100, 110), cols=(40, 60)))


def test_strip_job_is_the_query_row_pooled_and_names_its_strongest_keys(lazy_run):
    r = lazy_run
    s = lv.strip_job(r, 0, 1, 77, width=50, top=4)
    row = r.attention(0, 1, rows=77)
    edges = pool_edges(300, 50)
    np.testing.assert_array_equal(s.values, np.maximum.reduceat(row, edges[:-1]))
    best = np.argsort(-row, kind="stable")[:4]
    assert [j for j, _ in s.top] == list(best) and s.top[0][1] == pytest.approx(float(row.max()))
    assert (s.query, s.total, s.tag) == (77, 300, lv.result_tag(r))


def test_overview_fills_in_head_by_head_with_progress(lazy_run, monkeypatch):
    r = lazy_run
    parts = list(lv.overview_job(r, cell_max=32))
    dones = [d for d, _, _ in parts]
    assert dones == sorted(dones) and dones[-1] == 8 and all(t == 8 for _, t, _ in parts)
    grid = parts[-1][2]
    assert (grid.layers, grid.heads, grid.cell) == (2, 4, 32) and not np.isnan(grid.weights).any()
    for layer in range(2):
        for head in range(4):
            np.testing.assert_array_equal(grid.weights[layer * 32:(layer + 1) * 32, head * 32:(head + 1) * 32],
                                          r.attention(layer, head, pool=32))
    # shown more often than the clock would allow here: the heads still to come are blank, never 0
    monkeypatch.setattr(lv.time, "perf_counter", iter(np.arange(0, 100, 1.0)).__next__)
    first = next(iter(lv.overview_job(r, cell_max=32)))
    done, _, g = first
    assert 0 < done < 8 and np.isnan(g.weights[32:, :]).all() and not np.isnan(g.weights[:32, :32]).any()


def test_query_rows_job_gives_every_heads_row(lazy_run):
    r = lazy_run
    got = lv.query_rows_job(r, 123)
    assert got.values.shape == (8, 300) and got.layers == (0, 1)
    np.testing.assert_array_equal(got.values[1 * 4 + 3], r.attention(1, 3, rows=123))
    one = lv.query_rows_job(r, 123, (1,))  # one layer's heads: the overlay's ask
    assert one.layers == (1,)
    np.testing.assert_array_equal(one.values, got.values[4:])


def test_windowed_means_lazy_or_longer_than_the_threshold(lazy_run, monkeypatch):
    import dataclasses

    assert lv.windowed(lazy_run) and not lv.windowed(lazy_run, stack="decoder")
    assert not lv.windowed(None)
    dense = dataclasses.replace(lazy_run, lazy=None, attentions=np.zeros((2, 4, 300, 300), np.float32))
    assert not lv.windowed(dense)  # 300 tokens: drawn whole
    monkeypatch.setattr(lv, "WINDOWED_FROM", 299)
    assert lv.windowed(dense)


def test_sinks_are_columns_far_above_the_rest_even_when_every_weight_is_small():
    rng = np.random.default_rng(0)
    a = (rng.random((24, 40)) * 0.01).astype(np.float32)  # a window of small weights...
    a[::2, 0] = 0.3  # ...with key 0 taking 0.3 of every other row (a mean of 0.15: under SINK_SHARE)
    assert list(lv.sink_columns(a)) == [0]
    s = lv.colour_scale(a, "clip", False)
    assert s.levels[1] == pytest.approx(np.percentile(a[:, 1:], 99)) and np.isnan(s.values[:, 0]).all()
    assert lv.sink_columns(np.full((5, 5), 0.2, np.float32)).size == 0  # even rows: nothing stands apart
    wide = np.full((4, 20), 0.01, np.float32)
    wide[:, :10] = np.linspace(0.3, 0.5, 10)  # ten strong columns: a pattern; only the 4 strongest are left apart
    assert list(lv.sink_columns(wide)) == [6, 7, 8, 9]
