"""A hybrid model's layers in the window (issue 25 B), on a tiny random Qwen3.5 (3 Gated DeltaNet layers of 4 heads,
1 softmax layer of 6) and a tiny Granite 4 hybrid (Mamba-2, softmax, Mamba-2): the grid marks each row by its mixer
and draws the recurrent rows on a diverging scale centred at 0 (white = 0), the padded heads grey; the head page
colours a recurrent head's map with symmetric levels and a diverging colour bar titled "implicit attention
(...)", its read-out and the query strip's show signed values; the overview leaves recurrent rows and padded heads
blank and says why; a padded head is drawn blank, never as zeros."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF

pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_5")

from attn_explorer.session import mixers as mx  # noqa: E402
from tests.hub import test_parity_mamba_hybrids as granite  # noqa: E402
from tests.hub import test_parity_qwen35 as qwen  # noqa: E402

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen35_gui")
    qwen.make_folder(folder, "qwen3_5")
    return str(folder)


@pytest.fixture(scope="module")
def granite_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("granite4_gui")
    granite.make(folder, "granite4")
    return str(folder)


def _white(rgba):
    return tuple(int(x) for x in rgba[:3]) == (247, 247, 247)


def test_the_diverging_scale_is_centred_at_zero():
    lut = mx.diverging_lut()
    assert len(lut) % 2 and _white(lut[len(lut) // 2])
    assert lut[0][2] > lut[0][0] and lut[-1][0] > lut[-1][2]  # blue below, red above
    assert mx.signed_levels(np.array([[-0.3, 0.1]])) == pytest.approx((-0.3, 0.3))
    px = mx.diverging_rgba(np.array([[0.0, -0.3, 0.3]]), (-0.3, 0.3))[0]
    assert _white(px[0]) and px[1][2] > px[1][0] and px[2][0] > px[2][2]
    pooled = mx.signed_pool(np.array([[0.1, -0.9], [0.2, 0.3]]), 1, 1)
    assert pooled[0, 0] == pytest.approx(-0.9)  # the sign of the largest magnitude survives pooling


@pytest.mark.parametrize("which", ["qwen", "granite"])
def test_the_grid_marks_each_row_by_its_mixer(make_window, qtbot, qwen_folder, granite_folder, which):
    folder = qwen_folder if which == "qwen" else granite_folder
    w = make_window(model=folder, text=TEXT, view="grid")
    st, gv = w.state, w.grid
    qtbot.waitUntil(lambda: st.grid_image is not None and gv.mixers.rgba is not None, timeout=30000)
    info, r, g = st.info, st.result, st.grid_image
    L, H = g.layers, g.heads
    word = "DeltaNet" if which == "qwen" else "Mamba-2"
    labels = [gv.row_label(l) for l in range(L)]
    for l in range(L):
        assert labels[l] == f"L{l} · {word if info.mixers[l] != 'softmax' else labels[l].split(' · ')[1]}"
        assert ("softmax" in labels[l] or "global" in labels[l]) == (info.mixers[l] == "softmax")
    c = g.cell
    rgba = gv.mixers.rgba
    assert rgba.shape == (L * c, H * c, 4)
    for l in range(L):
        for h in range(H):
            tile = rgba[l * c:(l + 1) * c, h * c:(h + 1) * c]
            a = r.attentions[l, h]
            if h >= info.layer_heads[l]:  # a padded head: grey, not the colour of zero
                assert (tile == mx.ABSENT_RGBA).all()
            elif info.mixers[l] == "softmax":
                assert (tile[..., 3] == 0).all()  # the softmax mosaic shows through
            else:
                assert (tile[..., 3] == 255).all()
                assert all(_white(tile[i, j]) for i, j in zip(*np.nonzero(a == 0)))  # 0 is white
                top = np.abs(r.attentions[l, :info.layer_heads[l]]).max()  # the layer's scale
                neg, pos = np.argwhere(a < -0.02 * top), np.argwhere(a > 0.02 * top)
                assert all(tile[i, j][2] > tile[i, j][0] for i, j in neg)  # blue below 0
                assert all(tile[i, j][0] > tile[i, j][2] for i, j in pos)  # red above
    assert (r.attentions[[l for l in range(L) if info.mixers[l] != "softmax"]] < 0).any()  # signed maps indeed
    assert gv.mixers.bar.isVisible() and f"implicit attention ({'Gated DeltaNet' if which == 'qwen' else 'Mamba-2'})" \
        in gv.mixers.label
    text = gv.title.text()
    assert f"Rows marked {word}" in text and "not probabilities" in text and "grey cells" in text


def test_a_softmax_only_model_has_no_overlay(make_window, qtbot):
    w = make_window(text=TEXT, view="grid")
    qtbot.waitUntil(lambda: w.state.grid_image is not None, timeout=30000)
    assert w.grid.mixers.rgba is None and not w.grid.mixers.bar.isVisible()
    assert "Rows marked" not in w.grid.title.text()


def test_the_head_page_draws_a_recurrent_head_signed(make_window, qtbot, qwen_folder):
    w = make_window(model=qwen_folder, text=TEXT, view="head")
    st, hv = w.state, w.head_view
    st.select(1, 2)  # a DeltaNet layer
    qtbot.waitUntil(lambda: hv._head is not None and hv._head[1:] == (1, 2) and hv.matrix is not None)
    a = st.result.attentions[1, 2]
    np.testing.assert_array_equal(hv.matrix, a)
    lo, hi = hv.colorbar.levels()
    top = float(np.abs(a).max())
    assert (lo, hi) == pytest.approx((-top, top))  # centred at 0
    lut = hv.colorbar.colorMap().getLookupTable(0.0, 1.0, 257, alpha=False)
    assert np.abs(lut[128].astype(int) - 247).max() <= 1  # white at 0
    assert "implicit attention (Gated DeltaNet)" in hv.colorbar.axis.labelText
    assert "implicit attention (Gated DeltaNet)" in hv.title.text() and "signed" in hv.title.text()
    i, j = np.unravel_index(int(np.argmin(a)), a.shape)  # the most negative weight
    assert a[i, j] < 0
    hv._hovered(hv.plot.vb.mapViewToScene(QPointF(j + 0.5, i + 0.5)))
    assert hv.readout.text().endswith(f"{a[i, j]:+.3g} (signed)")
    st.set_query(int(i))
    qtbot.waitUntil(lambda: hv.strip.strip is not None and hv.strip.strip.query == int(i))
    assert "(signed)" in hv.strip.readout.text() and "implicit attention" in hv.strip.readout.text()
    row = a[i]
    first = int(np.argmax(np.abs(row)))  # the key read most is the one of largest |A|, with its sign
    assert hv.strip.strip.top[0] == (first, pytest.approx(float(row[first])))
    assert f"({first:,}) <b>{float(row[first]):+.3g} (signed)</b>" in hv.strip.readout.text()
    st.select(3, 2)  # back to the softmax layer: the session's colour map and 0..1 again
    qtbot.waitUntil(lambda: hv._head is not None and hv._head[1:] == (3, 2))
    assert hv.colorbar.levels() == pytest.approx((0.0, 1.0))
    assert "implicit" not in hv.colorbar.axis.labelText
    hv._hovered(hv.plot.vb.mapViewToScene(QPointF(0.5, 5.5)))
    assert "(signed)" not in hv.readout.text()


def test_a_padded_head_is_drawn_blank_not_as_zeros(make_window, qtbot, qwen_folder):
    w = make_window(model=qwen_folder, text=TEXT, view="head")
    st, hv = w.state, w.head_view
    assert st.info.layer_heads[0] == 4 and st.info.num_heads == 6
    st.select(0, 5)
    qtbot.waitUntil(lambda: hv._head is not None and hv._head[1:] == (0, 5))
    assert (st.result.attentions[0, 5] == 0).all()  # the run pads it with zeros
    assert np.isnan(hv.matrix).all()  # the page draws nothing there
    assert "does not exist" in hv.title.text()


@pytest.mark.parametrize("which", ["qwen", "granite"])
def test_the_overview_says_its_statistics_do_not_apply(make_window, qtbot, qwen_folder, granite_folder, which):
    w = make_window(model=qwen_folder if which == "qwen" else granite_folder, text=TEXT, view="overview")
    page = w.pages["overview"]
    qtbot.waitUntil(lambda: page.stats is not None, timeout=30000)
    info = w.state.info
    rec = [l for l, k in enumerate(info.mixers) if k != "softmax"]
    soft = [l for l, k in enumerate(info.mixers) if k == "softmax"]
    img = page.images["entropy"].image
    assert np.isnan(img[rec]).all() and np.isfinite(img[soft][:, :info.layer_heads[soft[0]]]).all()
    assert "do not apply" in page.caption.text() and f"Layers {', '.join(map(str, rec))}" in page.caption.text()
    assert "do not apply" in page.describe("entropy", rec[0], 0)
    assert "entropy" in page.describe("entropy", soft[0], 0) and "do not apply" not in page.describe("entropy",
                                                                                                    soft[0], 0)
    for link in page.caption.text().split("href='")[1:]:  # no finding names a recurrent layer
        assert int(link.split(",")[0]) in soft


def test_the_token_page_draws_recurrent_rows_signed(make_window, qtbot, qwen_folder):
    w = make_window(model=qwen_folder, text=TEXT, view="tokens")
    st, tv = w.state, w.token_view
    st.select(0, 1)
    st.set_query(6)
    qtbot.waitUntil(lambda: tv.mixers.rgba is not None and tv.rows is not None, timeout=30000)
    info, H = st.info, st.info.num_heads
    rgba = tv.mixers.rgba
    assert rgba.shape[:2] == tv.rows.shape
    for l, kind in enumerate(info.mixers):
        for h in range(H):
            row = rgba[l * H + h]
            if h >= info.layer_heads[l]:
                assert (row == mx.ABSENT_RGBA).all()
            elif kind == "softmax":
                assert (row[:, 3] == 0).all()
            else:
                assert all(_white(c) for c, v in zip(row, tv.rows[l * H + h]) if v == 0)  # above the query: 0
    assert "signed implicit maps" in tv.caption.text() and "grey rows" in tv.caption.text()
    assert "implicit attention (Gated DeltaNet), signed" in tv.sentence.text()


def test_a_long_recurrent_map_is_painted_signed(make_window, qtbot, qwen_folder, monkeypatch):
    from attn_explorer.session import long_view

    monkeypatch.setattr(long_view, "WINDOWED_FROM", 4)  # this short input goes through the window lane
    w = make_window(model=qwen_folder, text=TEXT, view="head")
    st, hv = w.state, w.head_view
    st.select(2, 1)
    qtbot.waitUntil(lambda: hv.long and (hv.long_map.window or hv.long_map.base) is not None and hv._head is not None
                    and hv._head[1:] == (2, 1), timeout=30000)
    qtbot.waitUntil(lambda: "implicit attention (Gated DeltaNet)" in hv.colorbar.axis.labelText)
    lo, hi = hv.colorbar.levels()
    assert lo == pytest.approx(-hi) and hi > 0


def test_the_dk_panel_says_entropy_does_not_apply_to_a_recurrent_layer(make_window, qtbot, qwen_folder):
    w = make_window(model=qwen_folder, text=TEXT, view="grid")
    st, panel = w.state, w.dk_panel
    st.select(0, 1)
    qtbot.waitUntil(lambda: "do not apply" in panel.readout.text())
    assert panel.entropy is None and "Gated DeltaNet" in panel.readout.text()
    st.select(3, 1)  # the softmax layer: its entropy as before
    qtbot.waitUntil(lambda: panel.entropy is not None)
    assert "mean row entropy" in panel.readout.text()


def test_the_html_page_refuses_signed_maps_in_one_line(make_window, qtbot, qwen_folder):
    """api.html quantises 0..1 weights (negatives clipped to 0): a hybrid's page would be silently wrong."""
    from attn_explorer.errors import UserError
    from attn_explorer.session.html_export import page_options

    w = make_window(model=qwen_folder, text=TEXT, view="grid")
    with pytest.raises(UserError, match=r"^qwen3_5_text: .*signed implicit maps of its recurrent layers 0, 1, 2") as e:
        page_options(w.state, "grid")
    assert "\n" not in str(e.value)


def test_head_search_ranks_softmax_heads_only_and_rollout_does_not_apply(make_window, qtbot, qwen_folder):
    w = make_window(model=qwen_folder, text=TEXT, view="search")
    page = w.pages["search"]
    page.set_pattern("previous")
    qtbot.waitUntil(lambda: bool(page.ranked) and page.pattern.currentData() == "previous", timeout=30000)
    info = w.state.info
    assert all(info.mixers[s.layer] == "softmax" for s in page.ranked) and len(page.ranked) == info.layer_heads[3]
    assert np.isnan(page.scores[:3]).all() and np.isfinite(page.scores[3]).all()
    assert "do not apply" in page.caption.text()
    page._hovered(page.cell_center(0, 0))
    assert "does not apply" in page.readout.text()
    w.show_page("rollout")
    roll = w.pages["rollout"]
    qtbot.waitUntil(lambda: "does not apply" in roll.stack.placeholder.text(), timeout=30000)
    assert "layers 0, 1, 2 are recurrent" in roll.stack.placeholder.text() and roll.layers is None


def test_the_lines_page_draws_a_recurrent_layer_by_magnitude_and_says_so(make_window, qtbot, qwen_folder):
    w = make_window(model=qwen_folder, text=TEXT, view="lines")
    page = w.pages["lines"]
    w.state.select(1, 0)
    qtbot.waitUntil(lambda: page.att is not None and "Layer 1" in page.caption.text(), timeout=30000)
    a = np.abs(w.state.result.attentions[1])
    n = page.att.shape[-1]
    np.testing.assert_allclose(page.att, (a / a.max())[:, :n, :n], rtol=1e-6)
    assert "implicit attention (Gated DeltaNet)" in page.caption.text() and "|A|" in page.caption.text()
    w.state.select(3, 0)
    qtbot.waitUntil(lambda: "Layer 3" in page.caption.text(), timeout=30000)
    assert "|A|" not in page.caption.text()
    np.testing.assert_array_equal(page.att, w.state.result.attentions[3][:, :n, :n])


def test_hiding_specials_drops_them_from_a_signed_map_without_renormalising(make_window, qtbot, qwen_folder):
    a = np.array([[0.5, 0.0, 0.0], [-0.2, 0.3, 0.0], [0.1, -0.4, 0.2]], np.float32)
    np.testing.assert_array_equal(mx.signed_without_specials(a, np.array([True, False, False])), a[1:, 1:])
    w = make_window(model=qwen_folder, text=TEXT, view="head")
    st, hv = w.state, w.head_view
    r = st.result
    r.special[0] = True  # as if the first token were special (the tiny tokenizer adds none)
    st.select(1, 0)
    st.set_options(hide_special=True)
    qtbot.waitUntil(lambda: hv._head is not None and hv._head[1:] == (1, 0) and hv.matrix is not None
                    and hv.matrix.shape[0] == r.num_tokens - 1)
    np.testing.assert_array_equal(hv.matrix, r.attentions[1, 0][1:, 1:])  # the signed weights as they are
    w.show_page("grid")
    qtbot.waitUntil(lambda: st.grid_image is not None and st.grid_image.hidden_specials
                    and w.grid.mixers.rgba is not None and w.grid.mixers.rgba.shape[0] == 4 * (r.num_tokens - 1),
                    timeout=30000)


def test_the_token_page_keeps_signed_rows_unrenormalised_when_hiding_specials(make_window, qtbot, qwen_folder):
    w = make_window(model=qwen_folder, text=TEXT, view="tokens")
    st, tv = w.state, w.token_view
    r = st.result
    r.special[0] = True
    st.set_query(6)
    st.set_options(hide_special=True)
    qtbot.waitUntil(lambda: tv.rows is not None and tv.rows.shape[1] == r.num_tokens - 1, timeout=30000)
    H = st.info.num_heads
    np.testing.assert_array_equal(tv.rows[H:2 * H], r.attentions[1, :, 6, 1:])  # DeltaNet layer 1 as it is
    soft = r.attentions[3, :, 6, 1:]
    np.testing.assert_allclose(tv.rows[3 * H:], soft / soft.sum(-1, keepdims=True), rtol=1e-5)  # softmax: renormalised


def test_a_lazy_hybrid_run_colours_the_overviews_cells(make_window, qtbot, qwen_folder):
    """A long input's run keeps no maps (r.attentions refuses): the grid colours its pooled overview instead."""
    w = make_window(model=qwen_folder, text=TEXT, view="grid")
    st, gv = w.state, w.grid
    lazy = st._model.run(TEXT, lazy=True)
    assert lazy.is_lazy
    st.result = lazy
    st.attention_ready.emit(lazy)
    qtbot.waitUntil(lambda: gv._overview is not None and gv._overview[2] >= gv._overview[3], timeout=60000)
    qtbot.waitUntil(lambda: gv.mixers.rgba is not None, timeout=30000)
    grid = gv._overview[1]
    c = grid.cell
    cells = grid.weights.reshape(grid.layers, c, grid.heads, c).transpose(0, 2, 1, 3)
    tile = gv.mixers.rgba[c:2 * c, 0:c]  # layer 1 (DeltaNet), head 0
    neg = np.argwhere(cells[1, 0] < -0.02 * np.abs(cells[1, :4]).max())
    assert len(neg) and all(tile[i, j][2] > tile[i, j][0] for i, j in neg)  # blue where the pooled cell is < 0
    assert (gv.mixers.rgba[3 * c:, :, 3] == 0).all()  # the softmax layer shows through
    assert (gv.mixers.rgba[:c, 4 * c:] == mx.ABSENT_RGBA).all()  # layer 0's heads 4, 5 do not exist: grey
    assert np.isnan(cells[0, 4]).all()  # the overview left them blank (it asked the run for no such head)


def test_a_lazy_runs_padded_head_is_blank_on_the_head_page(make_window, qtbot, qwen_folder):
    w = make_window(model=qwen_folder, text=TEXT, view="head")
    st, hv = w.state, w.head_view
    errors = []
    st.error_raised.connect(lambda *a: errors.append(a))
    lazy = st._model.run(TEXT, lazy=True)
    st.result = lazy
    st.attention_ready.emit(lazy)
    st.select(0, 5)
    qtbot.waitUntil(lambda: hv._head is not None and hv._head[1:] == (0, 5) and hv.long, timeout=30000)
    qtbot.wait(500)
    assert not errors and "no such head" in hv.scale_label.text() and "does not exist" in hv.title.text()
    assert "no such head" in hv.strip.readout.text() and hv.long_map.head is None
    st.select(1, 2)  # a real DeltaNet head of the same lazy run: drawn signed
    qtbot.waitUntil(lambda: "implicit attention (Gated DeltaNet)" in hv.colorbar.axis.labelText, timeout=30000)
    assert not errors
