"""`ax.show(r, analysis="name")`: your analysis drawn as one page from its answer's shape; and what `ax.show`
prints in plain Python, where nothing draws HTML."""
from __future__ import annotations

import re

import numpy as np
import pytest

import attn_explorer as ax
from attn_explorer.errors import UserError
from tests.api.test_html import fake_run
from tests.analysis_registry import prev_token, registry_kept


@pytest.fixture(autouse=True)
def clean_registry():
    with registry_kept():
        yield


def cells(page: str) -> list[tuple[str, float]]:
    """(where, value) of every drawn cell, from the hover titles."""
    return [(w, float(v)) for w, v in re.findall(r"<title>([^<]*): ([-0-9.e+]+)</title>", page)]


def test_show_draws_a_grid_answer_cell_by_cell(tmp_path):
    r = fake_run(L=2, H=3, N=7)
    ax.register_analysis("prev_token", prev_token)
    v = ax.show(r, analysis="prev_token")
    page = v._repr_html_()
    assert "<svg" in page and "prev_token" in page and "layer down, head across" in page
    got = dict(cells(page))
    want = prev_token(r)
    assert len(got) == 6
    for l in range(2):
        for h in range(3):
            assert got[f"L{l} H{h}"] == pytest.approx(want[l, h], rel=1e-3)
    np.testing.assert_array_equal(v.values, want)
    p = v.save(tmp_path / "prev.html")
    assert p.read_text(encoding="utf-8").startswith("<!doctype html>") and [q.name for q in tmp_path.iterdir()] == ["prev.html"]


def test_show_draws_tokens_as_a_strip_and_a_signed_answer_around_zero():
    r = fake_run(L=2, H=3, N=7)
    ax.register_analysis("centred", lambda r: r.attentions[0, 0, -1] - r.attentions[0, 0, -1].mean())
    page = ax.show(r, analysis="centred")._repr_html_()
    got = cells(page)
    assert [w for w, _ in got] == r.tokens  # one row: a cell per token, in order
    assert "rgb(33,102,172)" in page or "rgb(178,24,43)" in page  # the diverging scale's ends
    assert "one number per token" in page


def test_show_pools_a_large_map_and_says_so():
    r = fake_run(L=1, H=1, N=300)
    ax.register_analysis("mean_map", lambda r: r.attentions.mean((0, 1)))
    page = ax.show(r, analysis="mean_map")._repr_html_()
    assert len(cells(page)) == 100 * 100 and "mean-pooled to 100 × 100" in page


def test_show_analysis_refuses_in_one_line():
    r = fake_run()
    with pytest.raises(UserError, match="unknown analysis 'nope'"):
        ax.show(r, analysis="nope")
    ax.register_analysis("boom", lambda r: 1 / 0)
    with pytest.raises(UserError, match="analysis 'boom' failed: ZeroDivisionError"):
        ax.show(r, analysis="boom")
    ax.register_analysis("prev_token", prev_token)
    with pytest.raises(UserError, match="drop widget=True"):
        ax.show(r, analysis="prev_token", widget=True)


def test_in_plain_python_show_says_what_it_is_and_how_to_see_it():
    r = fake_run(L=2, H=3, N=7)
    text = repr(ax.show(r))
    assert " object at 0x" not in text
    assert "attention page of fake-bert" in text and ".save(\"page.html\")" in text and "notebook" in text
    ax.register_analysis("prev_token", prev_token)
    text = repr(ax.show(r, analysis="prev_token"))
    assert "analysis 'prev_token'" in text and "'grid', 2 × 3" in text and ".save(\"page.html\")" in text
