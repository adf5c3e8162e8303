"""Issue 24 D: after an edit that reused the prefix (Model.run(reuse_prefix=True), a causal model), the long
grid's overview (session.long_view.overview_job) recomputes only the rows from the first changed token on:
the cells above it are the previous overview's, and the mosaic equals a full recompute."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.session.long_view import overview_job, reused_prefix  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = ("The capital of France is Paris. Attention lets every token look at the tokens before it. "
        "A small model with random weights still attends to something: often the first token. ") * 3


class Counting:
    """r, counting the query rows each attention request computes."""

    def __init__(self, r):
        self.r, self.rows = r, 0

    def __getattr__(self, name):
        return getattr(self.r, name)

    def attention(self, layer, head, rows=None, cols=None, pool=None, **kw):
        a, b = (0, self.r.num_tokens) if rows is None else rows
        self.rows += b - a
        return self.r.attention(layer, head, rows=rows, cols=cols, pool=pool, **kw)


def _last(job):
    out = None
    for out in job:
        pass
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return ax.load_model(str(make_llama_folder(tmp_path_factory.mktemp("m") / "m")), device="cpu")


def test_an_edit_with_a_reused_prefix_recomputes_only_the_changed_rows(model):
    a = model.run(TEXT + "Madrid", reuse_prefix=True, lazy=True)
    b = model.run(TEXT + "Rome", reuse_prefix=True, lazy=True)
    p = reused_prefix(b)
    n = b.num_tokens
    assert a.num_tokens == n and 0 < p < n, (a.num_tokens, n, p)  # one word replaced: same length, prefix reused
    cell = 16  # pooled: each cell covers several rows
    before = _last(overview_job(a, cell))[2]
    full = Counting(b)
    want = _last(overview_job(full, cell))[2]
    part = Counting(b)
    got = _last(overview_job(part, cell, previous=(before, a.num_tokens)))[2]
    np.testing.assert_allclose(got.weights, want.weights, rtol=1e-5, atol=1e-8)  # tiles of other shapes: rounding
    L, H = b.lazy.shape[:2]
    assert full.rows == L * H * n
    first = int(np.searchsorted(np.arange(cell + 1) * n // cell, p, side="right")) - 1  # the cell p falls in
    assert part.rows == L * H * (n - first * n // cell) < full.rows / 4, (part.rows, full.rows)


def test_a_previous_overview_of_another_length_is_not_reused(model):
    short = TEXT[:len(TEXT) // 3]  # within the model's 128 positions, with room to grow
    a = model.run(short, reuse_prefix=True, lazy=True)
    b = model.run(short + "Rome and Paris", reuse_prefix=True, lazy=True)
    assert reused_prefix(b) > 0 and a.num_tokens != b.num_tokens
    before = _last(overview_job(a, 16))[2]
    part = Counting(b)
    got = _last(overview_job(part, 16, previous=(before, a.num_tokens)))[2]
    np.testing.assert_array_equal(got.weights, _last(overview_job(b, 16))[2].weights)
    assert part.rows == b.lazy.shape[0] * b.lazy.shape[1] * b.num_tokens  # the bins moved: every row again
