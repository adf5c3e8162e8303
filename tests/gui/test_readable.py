"""What a user reads off the pages: one colour-bar label, a clean loading screen, legible labels at 512
tokens and at 1024×700, square grid tiles, the right page for images, specials hidden everywhere."""
from __future__ import annotations

import argparse
import threading

import numpy as np
import pytest
from PySide6.QtGui import QFontMetrics

from attn_explorer.gui.widgets.heatmap import scale_label
from attn_explorer.gui.widgets.overlay import blend, patch_heat, upsample
from tests.gui.conftest import cached_loader, sample


def _bar_labels(bar) -> list[str]:
    out = []
    for key in ("left", "right", "top", "bottom"):
        ax = bar.getAxis(key)
        if ax.isVisible() and ax.label.isVisible() and ax.labelText:
            out.append(ax.labelText)
    return out


def test_each_colour_bar_has_one_label(make_window, qtbot):
    w = make_window(model="minilm", view="grid")
    st = w.state
    bars = {"grid": w.grid.colorbar, "head": w.head_view.colorbar, "tokens": w.token_view.colorbar}
    for log, hide in ((True, False), (True, True), (False, True), (False, False)):
        st.set_options(log_scale=log, hide_special=hide)
        for page, bar in bars.items():
            w.show_page(page)
            assert _bar_labels(bar) == [scale_label(log)], (page, log, hide)


def test_first_screen_is_a_clean_loading_state(qtbot, settings):
    from attn_explorer.gui.window.app import build_window, get_qapp

    get_qapp()
    gate = threading.Event()

    def slow_loader(src, device="cpu", progress=None, want_image=False):
        gate.wait(30)
        return cached_loader(src, device, progress, want_image)

    args = argparse.Namespace(model="textbook", text=None, image=None, device="cpu", view=None, screenshot=None)
    w, st = build_window(args, settings=settings, loader=slow_loader)
    qtbot.addWidget(w)
    w.resize(1300, 850)
    w.show()
    try:
        qtbot.wait(100)
        for page in ("grid", "head", "tokens"):
            w.show_page(page)
            p = w.pages[page]
            assert not p.canvas.isVisible() and "Loading" in p.placeholder.text()
        assert not w.dk_panel.plot.isVisible() and not w.seq_panel.plot.isVisible()
        assert "Loading" in w.dk_panel.readout.text()
    finally:
        gate.set()
    qtbot.waitUntil(lambda: st.result is not None, timeout=60000)
    w.show_page("grid")
    qtbot.waitUntil(lambda: w.grid.canvas.isVisible() and w.dk_panel.plot.isVisible() and w.seq_panel.plot.isVisible())
    st.shutdown()


def _spaced(axis, font_px: int) -> None:
    drawn = axis.drawn_labels()
    assert len(drawn) >= 2
    gaps = np.diff(sorted(p for p, _ in drawn))
    assert gaps.min() >= font_px, f"labels {gaps.min():.1f} px apart, font {font_px} px"


LONG = " ".join(f"w{i}" for i in range(600))  # textbook: one token per word, cut to 512


def test_token_focus_stays_readable_at_512_tokens(make_window, qtbot):
    w = make_window(model="textbook", text=LONG, view="tokens")
    tv, st = w.token_view, w.state
    qtbot.waitUntil(lambda: tv.rows is not None and st.result.num_tokens == 512)
    st.set_query(300)
    qtbot.waitUntil(lambda: w.token_view.caption.text().count("token 300") == 1)
    qtbot.wait(50)
    assert tv.canvas.height() > 0.4 * tv.height()  # the heatmap keeps most of the page
    assert tv.sentence.height() < 0.25 * tv.height()
    x0, x1 = tv.plot.vb.viewRange()[0]
    assert x1 - x0 <= 80 and x0 <= 300 < x1  # a window of keys around the query
    _spaced(tv.bottom_axis, QFontMetrics(tv.bottom_axis.font()).height())
    assert any(t == "w300" for _, t in tv.bottom_axis.drawn_labels())


def test_head_view_stays_readable_at_512_tokens_and_zooms(make_window, qtbot):
    w = make_window(model="textbook", text=LONG, view="head")
    hv = w.head_view
    qtbot.waitUntil(lambda: hv.matrix is not None and hv.matrix.shape == (512, 512))
    fm = QFontMetrics(hv.left_axis.font())
    for ax in (hv.left_axis, hv.bottom_axis):
        _spaced(ax, fm.height())
    hv.plot.setRange(xRange=(100, 110), yRange=(200, 210), padding=0)
    qtbot.wait(50)
    assert [t for _, t in hv.bottom_axis.drawn_labels()] == [f"w{i}" for i in range(100, 110)]
    assert [t for _, t in hv.left_axis.drawn_labels()] == [f"w{i}" for i in range(200, 210)]


def test_head_axis_title_clears_long_rotated_labels_at_1024x700(make_window, qtbot):
    text = "internationalization counterrevolutionaries incomprehensibilities a b c"
    w = make_window(model="textbook", text=text, view="head")
    w.resize(1024, 700)
    qtbot.waitUntil(lambda: w.head_view.matrix is not None)
    qtbot.wait(100)
    ax = w.head_view.bottom_axis
    ticks_end = ax.tick_text_extent()  # px below the axis line where the longest rotated label ends
    title_top = ax.label.pos().y() + 4  # the title's glyphs start a few px below its box
    assert ticks_end <= title_top, (ticks_end, title_top)


def test_image_grid_tiles_are_square(make_window, qtbot):
    w = make_window(model="textbook-vit", image=sample("coffee"), view="grid")
    qtbot.waitUntil(lambda: w.grid.last_image is not None)
    qtbot.wait(100)
    a, b = w.grid.cell_center(0, 0), w.grid.cell_center(1, 1)
    dx, dy = abs(b.x() - a.x()), abs(b.y() - a.y())
    assert dx > 20 and abs(dx - dy) <= 0.03 * dx, (dx, dy)


def test_picking_a_sample_opens_the_overlay(make_window, qtbot):
    w = make_window(model="textbook", view="grid")
    picker = w.input_panel.samples
    i = picker.findText("coffee")
    picker.setCurrentIndex(i)
    picker.activated.emit(i)
    qtbot.waitUntil(lambda: w.state.result.grid is not None and not w.state.busy, timeout=60000)
    assert w.current_page_name == "overlay"
    w.state.set_text("words again")  # and a text model does not stay on the image page
    qtbot.waitUntil(lambda: w.state.result.grid is None and not w.state.busy, timeout=60000)
    assert w.current_page_name == "grid"


def test_hide_special_tokens_works_in_every_view(make_window, qtbot):
    w = make_window(model="minilm", view="head")
    st = w.state
    qtbot.waitUntil(lambda: w.head_view.matrix is not None)
    w.hide_special_box.setChecked(True)
    assert st.hide_special and w.token_view.hide_special.isChecked()
    hv = w.head_view
    assert hv.matrix.shape == (14, 14) and "[CLS]" not in hv.tokens and "[SEP]" not in hv.tokens
    np.testing.assert_allclose(hv.matrix.sum(axis=1), 1.0, atol=1e-5)
    w.show_page("grid")
    qtbot.waitUntil(lambda: w.grid.last_image is not None and w.grid.last_image.shape == (6 * 14, 12 * 14))
    w.token_view.hide_special.setChecked(False)
    assert not w.hide_special_box.isChecked()
    w.show_page("head")
    assert hv.matrix.shape == (16, 16)


def test_overlay_smooth_mode_and_colour_bar(make_window, qtbot):
    w = make_window(model="textbook-vit", image=sample("coffee"), view="overlay")
    ov = w.overlay
    qtbot.waitUntil(lambda: ov.big_rgb is not None)
    blocky = ov.big_rgb.copy()
    lo, hi = ov.colorbar.levels()
    assert lo == 0 and hi > 0
    ov.smooth.setChecked(True)
    assert not np.array_equal(blocky, ov.big_rgb)
    st, r = w.state, w.state.result
    heat = patch_heat(r.attentions[st.layer, st.head, st.query], r.grid, r.patch_offset)
    np.testing.assert_array_equal(ov.big_rgb, blend(r.image, heat, st.alpha, st.colormap, smooth=True))
    # bilinear between patch centres: many more levels than one per patch, and no jump between patches
    rows, cols = r.grid
    ih, iw = r.image.shape[:2]
    for smooth in (False, True):
        up = upsample(heat, ih, iw, smooth)
        assert up.shape == (ih, iw) and np.isclose(up.max(), heat.max(), rtol=0.05)
        levels = len(np.unique(up))
        assert levels <= rows * cols if not smooth else levels > 20 * rows * cols
    step = np.abs(np.diff(upsample(heat, ih, iw, True), axis=1)).max()
    assert step < 0.5 * np.abs(np.diff(heat, axis=1)).max()
    assert _bar_labels(ov.colorbar) == ["weight (0 to 98th pct)"]  # one title, saying where the colours top out


@pytest.mark.parametrize("name,words", [("minilm", ("text", "trained")), ("textbook", ("text", "untrained")),
                                         ("textbook-vit", ("image", "untrained"))])
def test_model_picker_names_kind_and_training(make_window, name, words):
    w = make_window(model="textbook")
    i = w.model_combo.findData(name)
    assert i >= 0
    text = w.model_combo.itemText(i)
    assert name in text and all(word in text for word in words), text
    if "untrained" not in words:
        assert "untrained" not in text


@pytest.mark.parametrize("special", [[1, 0, 0, 0, 0, 0, 1], [0] * 7, [1] * 7])
def test_grid_head_and_token_views_hide_specials_by_one_rule(special):
    """The grid's mosaic (pooled in torch), the head view's map and the token view's rows agree on
    which tokens "hide special tokens" removes and how rows are renormalised, including the guard:
    nothing is hidden when no token, or every token, is special."""
    from types import SimpleNamespace

    from attn_explorer.api.display import grid_image
    from attn_explorer.gui.explorer.head_view import head_matrix
    from attn_explorer.gui.explorer.token_view import focus_rows
    from attn_explorer.maths import without_specials

    rng = np.random.default_rng(3)
    a = rng.random((2, 3, 7, 7)).astype(np.float32)
    a /= a.sum(-1, keepdims=True)
    special = np.array(special, bool)
    tokens = [f"t{i}" for i in range(7)]
    r = SimpleNamespace(attentions=a, special=special, tokens=tokens, num_tokens=7)
    expect = without_specials(a, special)
    n = expect.shape[-1]
    g = grid_image(a, drop=special)
    assert g.hidden_specials == (n < 7) and g.weights.shape == (2 * n, 3 * n)
    m, labels = head_matrix(r, 1, 2, True)
    np.testing.assert_allclose(g.weights[n:2 * n, 2 * n:3 * n], m, atol=1e-6)
    np.testing.assert_allclose(m, expect[1, 2], atol=1e-6)
    kept = [i for i in range(7) if n == 7 or not special[i]]
    assert labels == [tokens[i] for i in kept]
    q = kept[1]
    rows, keys = focus_rows(a, q, special, True)
    assert list(keys) == kept and rows.shape == (6, n)
    np.testing.assert_allclose(rows.reshape(2, 3, n)[1, 2], m[1], atol=1e-6)


def test_hide_special_tokens_renormalises_the_overlay(make_window, qtbot):
    w = make_window(model="textbook-vit", image=sample("coffee"), view="overlay")
    ov, st = w.overlay, w.state
    qtbot.waitUntil(lambda: ov.big_rgb is not None)
    shown = ov.colorbar.levels()[1]
    w.hide_special_box.setChecked(True)
    qtbot.waitUntil(lambda: not st.busy)
    r = st.result
    row = r.attentions[st.layer, st.head, st.query]
    patches = row[r.patch_offset:]
    assert np.isclose(ov.colorbar.levels()[1], shown / patches.sum(), rtol=1e-4)  # rows sum to 1 over patches
    assert "Special tokens hidden" in ov.caption.text()
