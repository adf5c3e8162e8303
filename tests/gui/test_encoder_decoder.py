"""The window with an encoder-decoder (a tiny random BART built here): the target box shows only for it and
re-runs as it is typed in, and the switch "Encoder | Decoder | Cross-attention" decides what the grid, the
head page and token focus draw (shapes, token labels, layer and head ranges, the page header), pooled
again in the worker without running the model again."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from attn_explorer.session.stacks import STACKS, stack_maps  # noqa: E402
from tests.hub.test_parity_bart import make_bart  # noqa: E402

SOURCE = "the cat sat on a mat"
TARGET = "the dog ran far away quick brown fox jumps"


@pytest.fixture(scope="module")
def bart_folder(tmp_path_factory):
    # 2 encoder layers × 3 heads, 3 decoder layers × 2 heads: every range has to come from the right stack
    _, folder = make_bart(tmp_path_factory.mktemp("bart"))
    return str(folder)


def _choose(w, page, stack: str) -> None:
    """Pick `stack` in a page's switch as the user does (the combo's activated signal)."""
    combo = page.stack_switch.combo
    i = STACKS.index(stack)
    combo.setCurrentIndex(i)
    combo.activated.emit(i)


def _tiled(a: np.ndarray) -> np.ndarray:
    L, H, R, C = a.shape
    return a.transpose(0, 2, 1, 3).reshape(L * R, H * C)


def _bart_window(make_window, qtbot, bart_folder, target=TARGET):
    w = make_window(model=bart_folder, text=SOURCE)
    st = w.state
    st.set_target(target)
    qtbot.waitUntil(lambda: not st.busy and st.result is not None
                    and st.result.decoder_tokens[2:] == TARGET.split(), timeout=30000)
    return w, st


def test_the_target_box_shows_only_for_an_encoder_decoder(make_window, qtbot, bart_folder):
    w = make_window(model="textbook")
    panel = w.input_panel
    assert panel.target.isHidden() and panel.target_label.isHidden()
    assert w.grid.stack_switch.isHidden() and w.head_view.stack_switch.isHidden()
    assert "target" not in st_run_kwargs(w.state)
    with qtbot.waitSignal(w.state.model_loaded, timeout=60000):
        w.state.load_model(bart_folder)
    assert not panel.target.isHidden() and not panel.target_label.isHidden()
    assert not w.grid.stack_switch.isHidden()
    with qtbot.waitSignal(w.state.model_loaded, timeout=60000):
        w.state.load_model("textbook")
    assert panel.target.isHidden() and w.grid.stack_switch.isHidden()


def st_run_kwargs(st) -> dict:
    return st.run_input()[1]


def test_typing_a_target_runs_the_decoder_on_it(make_window, qtbot, bart_folder):
    import attn_explorer as ax

    w = make_window(model=bart_folder, text=SOURCE)
    st, box = w.state, w.input_panel.target
    assert st.result.decoder_tokens[1:] == st.result.tokens[:-1]  # no target: the decoder reads the source
    assert "no target" in w.input_panel.current.text()
    box.setFocus()
    qtbot.keyClicks(box, TARGET)
    qtbot.waitUntil(lambda: not st.busy and st.target == TARGET
                    and st.result.decoder_tokens[2:] == TARGET.split(), timeout=30000)
    expected = ax.load_model(bart_folder, device="cpu").run(SOURCE, target=TARGET)
    np.testing.assert_allclose(st.result.cross_attentions, expected.cross_attentions, atol=1e-5)
    np.testing.assert_allclose(st.result.decoder_attentions, expected.decoder_attentions, atol=1e-5)
    # the start token, then <s> and the target without its last token (</s>)
    qtbot.waitUntil(lambda: f"Decoder: {len(TARGET.split()) + 2} target tokens" in w.input_panel.current.text())
    # the session's target shows in the box, whoever set it
    st.set_target("a fox")
    assert box.toPlainText() == "a fox"


def test_the_switch_changes_what_the_grid_head_and_token_pages_draw(make_window, qtbot, bart_folder):
    w, st = _bart_window(make_window, qtbot, bart_folder)
    r = st.result
    S, T = len(r.tokens), len(r.decoder_tokens)
    assert S != T  # a cross-attention map that is not square
    w.show_page("grid")
    qtbot.waitUntil(lambda: w.grid.last_image is not None)
    np.testing.assert_allclose(w.grid.last_image, _tiled(r.attentions), atol=1e-6)
    assert "encoder self-attention" in w.grid.title.text() and "2 layers × 3 heads" in w.grid.title.text()
    for stack, page in (("decoder", w.grid), ("cross", w.head_view), ("encoder", w.token_view),
                        ("cross", w.token_view)):
        _choose(w, page, stack)
        qtbot.waitUntil(lambda: st.grid_image.stack == stack and not st.busy, timeout=30000)
        assert st.result.attentions is r.attentions  # pooled again, not run again
        m = stack_maps(st.result, stack)
        w.show_page("grid")
        qtbot.waitUntil(lambda: w.grid.last_image is not None and w.grid.last_image.shape == _tiled(m.attentions).shape)
        np.testing.assert_allclose(w.grid.last_image, _tiled(m.attentions), atol=1e-6)
        L, H = m.attentions.shape[:2]
        assert f"{L} layers × {H} heads" in w.grid.title.text() and m.name.split(" (")[0] in w.grid.title.text()
        assert w.grid._shape == (L, H)
        for other in (w.grid, w.head_view, w.token_view):  # every switch shows the same choice
            assert other.stack_switch.combo.currentData() == stack
        w.show_page("head")
        qtbot.waitUntil(lambda: w.head_view.matrix is not None and w.head_view.stack_shown == stack)
        np.testing.assert_array_equal(w.head_view.matrix, m.attentions[st.layer, st.head])
        assert w.head_view.tokens == m.rows and w.head_view.col_tokens == m.cols
        assert m.name.split(" (")[0] in w.head_view.title.text()
        w.show_page("tokens")
        qtbot.waitUntil(lambda: w.token_view.rows is not None and w.token_view.rows.shape == (L * H, len(m.cols)))
        assert w.token_view._key_labels == m.cols
        assert w.token_view.strip.count() == len(m.rows)
    # cross: rows are the target's tokens, columns the source's
    assert w.head_view.matrix.shape == (T, S)
    assert w.head_view.describe(1, 2) == (f'query "{r.decoder_tokens[1]}" → key "{r.tokens[2]}": '
                                          f"{r.cross_attentions[st.layer, st.head, 1, 2]:.2f}")


def test_the_decoder_stacks_have_the_decoder_s_layers_and_heads(make_window, qtbot, bart_folder):
    w, st = _bart_window(make_window, qtbot, bart_folder)
    st.select(layer=5, head=5)  # wraps in the encoder's 2 × 3
    assert (st.layer, st.head) == (1, 2)
    _choose(w, w.grid, "decoder")
    assert (st.layer, st.head) == (1, 1)  # the decoder has 2 heads: the head is kept inside them
    assert (w.layer_spin.maximum(), w.head_spin.maximum()) == (2, 1)  # the toolbar spans the decoder
    w.layer_spin.setValue(2)
    assert st.layer == 2  # its third layer, which the encoder does not have
    st.step_layer(+5)
    assert st.layer == 2
    w.show_page("head")
    qtbot.waitUntil(lambda: w.head_view.stack_shown == "decoder" and "Layer 2" in w.head_view.title.text())
    np.testing.assert_array_equal(w.head_view.matrix, st.result.decoder_attentions[2, 1])
    with qtbot.waitSignal(st.selection_changed):
        _choose(w, w.head_view, "encoder")
    assert st.layer == 1 and (w.layer_spin.maximum(), w.head_spin.maximum()) == (1, 2)
    assert w.layer_spin.value() == 1
    qtbot.waitUntil(lambda: st.grid_image.stack == "encoder" and not st.busy, timeout=30000)


def test_hiding_specials_on_cross_attention_drops_them_on_both_axes(make_window, qtbot, bart_folder):
    w, st = _bart_window(make_window, qtbot, bart_folder)
    _choose(w, w.grid, "cross")
    st.set_options(hide_special=True)
    qtbot.waitUntil(lambda: st.grid_image.stack == "cross" and st.grid_image.hidden_specials and not st.busy,
                    timeout=30000)
    r = st.result
    keep_r = np.flatnonzero(~r.decoder_special)
    keep_c = np.flatnonzero(~r.special)
    a = r.cross_attentions[:, :, keep_r][:, :, :, keep_c]
    a = a / a.sum(-1, keepdims=True)
    np.testing.assert_allclose(st.grid_image.weights, _tiled(a), atol=1e-6)
    w.show_page("head")
    qtbot.waitUntil(lambda: w.head_view.matrix is not None and w.head_view.matrix.shape == a.shape[2:])
    np.testing.assert_allclose(w.head_view.matrix, a[st.layer, st.head], atol=1e-6)
    assert "<s>" not in w.head_view.col_tokens and "</s>" not in w.head_view.tokens


def test_a_cross_attention_mosaic_keeps_its_shape_when_pooled():
    """A target × source map wider than a cell: one pooling factor for both sides, so each head stays
    R/k × C/k and the mosaic is exactly the tiled block maxima."""
    from attn_explorer.api.display import grid_image

    rng = np.random.default_rng(0)
    a = rng.random((2, 3, 50, 300)).astype(np.float32)
    g = grid_image(a)
    k = 3  # ceil(300 / 128)
    assert (g.cell, g.cell_cols) == (17, 100) and g.weights.shape == (2 * 17, 3 * 100)
    pad = np.full((2, 3, 51, 300), -1.0, np.float32)
    pad[:, :, :50] = a
    blocks = pad.reshape(2, 3, 17, k, 100, k).max(axis=(3, 5))
    np.testing.assert_array_equal(g.weights, _tiled(blocks))


def test_every_stack_s_pages_fit_a_1024x700_window(make_window, qtbot, bart_folder):
    """The longer headers (stack, target × source counts) wrap: the window is not pushed wider than 1024."""
    w, st = _bart_window(make_window, qtbot, bart_folder)
    w.resize(1024, 700)
    for stack in STACKS:
        _choose(w, w.grid, stack)
        qtbot.waitUntil(lambda: st.grid_image.stack == stack and not st.busy, timeout=30000)
        for page in ("grid", "head", "tokens"):
            w.show_page(page)
            qtbot.waitUntil(lambda: w.minimumSizeHint().width() <= 1024 and w.width() == 1024, timeout=5000)


def test_a_target_token_double_clicked_does_not_open_the_encoder_s_inside_a_head(make_window, qtbot, bart_folder):
    """"Inside a head" shows the encoder's heads on the source: a decoder row picks the query only."""
    w, st = _bart_window(make_window, qtbot, bart_folder)
    view = w.token_view
    opened = []
    view.inside_requested.connect(opened.append)
    w.show_page("tokens")
    _choose(w, view, "cross")
    qtbot.waitUntil(lambda: view.strip.count() == len(st.result.decoder_tokens))
    view.strip.itemDoubleClicked.emit(view.strip.item(4))
    assert st.query == 4 and opened == []
    _choose(w, view, "encoder")
    qtbot.waitUntil(lambda: view.strip.count() == len(st.result.tokens))
    view.strip.itemDoubleClicked.emit(view.strip.item(2))
    assert st.query == 2 and opened == [2]
