"""Local and global layers on screen: every grid row and token-focus row says "local 5" or "global", the
one-head header says "local, window 5" or "global", and the labels fit the grid at 1024×700 (thinned out
when the rows are short, each one still tagged). Tiny random Gemma 3 and Mistral built in the test."""
from __future__ import annotations

import math

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from tests.tiny_llama import train_tokenizer  # noqa: E402

TEXT = "the cat sat on the mat because it was warm and the dog ran far away"


def _folder(tmp_path_factory, name, cfg_cls, model_cls, **cfg):
    folder = tmp_path_factory.mktemp(name) / name
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**cfg)).eval()
    hf.save_pretrained(folder, safe_serialization=True)
    train_tokenizer().save(str(folder / "tokenizer.json"))
    return str(folder)


BASE = dict(vocab_size=300, hidden_size=32, intermediate_size=37, num_attention_heads=4, num_key_value_heads=1,
            head_dim=8, max_position_embeddings=64, attn_implementation="eager", bos_token_id=1, eos_token_id=2,
            pad_token_id=0)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    # two local layers then a global one, as Gemma 3's 5:1 pattern is built (sliding_window_pattern)
    return _folder(tmp_path_factory, "gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", num_hidden_layers=6,
                   sliding_window=5, sliding_window_pattern=3, **BASE)


@pytest.fixture(scope="module")
def gemma3_deep(tmp_path_factory):
    return _folder(tmp_path_factory, "gemma3deep", "Gemma3TextConfig", "Gemma3ForCausalLM", num_hidden_layers=40,
                   sliding_window=512, sliding_window_pattern=6, **BASE)


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return _folder(tmp_path_factory, "mistral", "MistralConfig", "MistralForCausalLM", num_hidden_layers=3,
                   sliding_window=6, **BASE)


def _left_labels(plot) -> list[str]:
    return [label for _, label in plot.getAxis("left")._tickLevels[0]]


def test_every_grid_row_and_the_head_header_say_local_or_global(make_window, qtbot, gemma3):
    w = make_window(model=gemma3, text=TEXT, view="grid")
    st = w.state
    assert st.info.layer_kinds == ("local, window 5", "local, window 5", "global") * 2
    qtbot.waitUntil(lambda: w.grid.last_image is not None)
    qtbot.waitUntil(lambda: _left_labels(w.grid.plot)[:3] == ["L0 · local 5", "L1 · local 5", "L2 · global"])
    w.show_page("head")
    st.select(layer=2, head=1)
    qtbot.waitUntil(lambda: "Layer 2 (global), head 1" in w.head_view.title.text())
    st.select(layer=4)
    qtbot.waitUntil(lambda: "Layer 4 (local, window 5), head 1" in w.head_view.title.text())
    w.show_page("tokens")
    qtbot.waitUntil(lambda: w.token_view.rows is not None)
    assert _left_labels(w.token_view.plot) == ["L0 · local 5", "L1 · local 5", "L2 · global"] * 1 + [
        "L3 · local 5", "L4 · local 5", "L5 · global"]


def test_a_model_with_every_layer_local_and_one_without_kinds(make_window, qtbot, mistral):
    w = make_window(model=mistral, text=TEXT, view="grid")
    qtbot.waitUntil(lambda: _left_labels(w.grid.plot) == ["L0 · local 6", "L1 · local 6", "L2 · local 6"])
    w.show_page("head")
    qtbot.waitUntil(lambda: "Layer 0 (local, window 6)" in w.head_view.title.text())
    with qtbot.waitSignal(w.state.attention_ready, timeout=60000):
        w.state.load_model("textbook")
    w.show_page("grid")
    qtbot.waitUntil(lambda: _left_labels(w.grid.plot)[:2] == ["L0", "L1"])  # no kinds: the old tags go
    w.show_page("head")
    qtbot.waitUntil(lambda: w.head_view.title.text().startswith("<b>Layer 0, head"))


@pytest.mark.parametrize("size", [(1024, 700), (1920, 1080)])
def test_tagged_row_labels_fit_and_thin_out_on_short_rows(make_window, qtbot, gemma3_deep, size):
    w = make_window(model=gemma3_deep, text=TEXT, view="grid")
    w.resize(*size)
    grid = w.grid
    axis = grid.plot.getAxis("left")
    fm = grid.fontMetrics()

    def settled():
        labels = _left_labels(grid.plot)
        if not labels or grid.last_image is None:
            return False
        widest = max(fm.horizontalAdvance(t) for t in labels)
        step = grid._tick_steps[0]
        cell_h = grid.plot.vb.height() / 40
        # the axis made room for its longest tag, and rows too short for a label each are labelled every
        # step-th, so no two labels overlap
        return axis.width() >= widest and step * cell_h >= fm.height() and len(labels) == math.ceil(40 / step)

    qtbot.waitUntil(settled, timeout=10000)
    labels = _left_labels(grid.plot)
    step = grid._tick_steps[0]
    assert labels == [grid.row_label(l) for l in range(0, 40, step)]
    assert grid.row_label(5) == "L5 · global" and grid.row_label(0) == "L0 · local 512"
    assert all(" · " in t for t in labels)


def test_the_cost_page_ties_local_layers_to_the_window_variant(qtbot):
    from attn_explorer.gui.cost.page import CostPage

    page = CostPage()
    qtbot.addWidget(page)
    for tip in (page.variant_boxes["window"].toolTip(), page.window_spin.toolTip()):
        assert "Local layers (Gemma, Mistral)" in tip and "n·w, not n²" in tip
