"""Lesson page "block": the diagram's numbers and the loaded model's residual stream."""
from __future__ import annotations

import re

import numpy as np
import pytest

from attn_explorer.lessons import block


@pytest.fixture
def page_of(make_window, qtbot):
    def make(model: str):
        window = make_window(model=model)
        page = window.pages["lessons"].show_lesson("block")
        qtbot.waitUntil(lambda: page.stream is not None, timeout=60000)
        return window, page

    return make


def test_diagram_shows_the_traced_points(page_of):
    window, page = page_of("minilm")
    want = block.trace_block(window.state.text)
    assert [p.key for p in page.trace.points] == list(block.POINTS)
    for p in want.points:
        shape = "×".join(str(d) for d in p.shape)
        assert page.diagram.note_text(p.key) == f"({shape})  ‖·‖ = {p.norm:.2f}"
    assert page.diagram.note_text("hidden").startswith("(12×256)")
    assert "12 words" in page.words_label.text()


def _counts(text: str, unit: str) -> set[int]:
    return {int(n) for n in re.findall(rf"(\d+) {unit}\b", text)}


@pytest.mark.parametrize("model", ["minilm", "textbook"])
def test_every_token_count_agrees_with_the_side_panel(page_of, model):
    """The side panel says "Showing text: N tokens" (the loaded model's, specials included); a count of
    tokens on the page is that same N, and the lesson block's own input is counted in words."""
    window, page = page_of(model)
    panel = window.input_panel.current.text()
    n = window.state.result.num_tokens
    assert _counts(panel, "tokens") == {n}
    page_text = " ".join(w.text() for w in (page.words_label, page.form_label, page.stream_values))
    assert _counts(page_text, "tokens") == {n}, page_text
    assert _counts(page.words_label.text(), "words") == {len(page.trace.words)}


def test_minilm_stream_has_one_norm_per_layer_boundary_and_says_post_ln(page_of):
    window, page = page_of("minilm")
    s = page.stream
    assert len(s.norms) == window.state.info.num_layers + 1 == 7
    direct = block.stream_norms(window.state._model, window.state.text)
    np.testing.assert_allclose(s.norms, direct.norms, rtol=1e-6)
    assert "post-LN" in page.form_label.text() and "minilm" in page.form_label.text()
    assert ", ".join(f"{v:.2f}" for v in s.norms) in page.stream_values.text()
    xs, ys = page.stream_plot.getPlotItem().listDataItems()[0].getData()
    np.testing.assert_allclose(ys, s.norms)


def test_new_text_updates_both_halves(page_of, qtbot):
    window, page = page_of("textbook")
    assert "pre-LN" in page.form_label.text() and "untrained" in page.form_label.text()
    old = page.stream.norms
    window.state.set_text("a short one")
    qtbot.waitUntil(lambda: page.stream is not None and page.stream.num_tokens == 3, timeout=30000)
    assert page.trace.words == ["a", "short", "one"]
    assert page.diagram.note_text("x").startswith("(3×64)")
    assert page.stream.norms != old and len(page.stream.norms) == 3
