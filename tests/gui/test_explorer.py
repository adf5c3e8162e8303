"""The explorer window, driven as a user would: typing, sliders, clicks, bad input."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt

from attn_explorer.gui.explorer.controls import DK_STEPS, slider_from_dk
from attn_explorer.gui.widgets.stats import head_entropy_and_peak
from tests.gui.conftest import cached_model, sample


def _click_scene(qtbot, canvas, scene_pos):
    view_pt = canvas.mapFromScene(scene_pos)
    qtbot.mouseClick(canvas.viewport(), Qt.LeftButton, pos=QPoint(int(view_pt.x()), int(view_pt.y())))


def test_typing_updates_heatmaps_to_model_run(make_window, qtbot):
    w = make_window(model="minilm")
    st = w.state
    box = w.input_panel.text
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, "The cat sat on the mat because it was warm")
    final = box.toPlainText()
    qtbot.waitUntil(lambda: st.result is not None and st.text == final and not st.busy
                    and "warm" in st.result.tokens, timeout=30000)
    expected = cached_model("minilm").run(final)
    assert st.result.tokens == expected.tokens
    np.testing.assert_allclose(st.result.attentions, expected.attentions, atol=1e-5)
    # what the grid drew is exactly that attention, tiled: head h of layer l at block (l, h)
    L, H, N, _ = expected.attentions.shape
    tiled = expected.attentions.transpose(0, 2, 1, 3).reshape(L * N, H * N)
    np.testing.assert_allclose(w.grid.last_image, tiled, atol=1e-5)
    # and the head page shows the selected head
    w.show_page("head")
    qtbot.waitUntil(lambda: w.head_view.matrix is not None)
    np.testing.assert_allclose(w.head_view.matrix, expected.attentions[st.layer, st.head], atol=1e-5)
    i, j = expected.tokens.index("it"), expected.tokens.index("cat")
    assert w.head_view.describe(i, j).startswith('query "it" → key "cat": ')


def test_newest_input_wins(make_window, qtbot):
    w = make_window(model="textbook")
    st = w.state
    for k in range(12):
        st.set_text("one two three " * (k + 1))
    qtbot.waitUntil(lambda: not st.busy and st.result.num_tokens == len(cached_model("textbook").run(st.text).tokens),
                    timeout=30000)
    assert st.result.tokens == cached_model("textbook").run("one two three " * 12).tokens


def test_dk_slider_flattens_and_sharpens(make_window, qtbot):
    w = make_window(model="minilm")
    st, panel = w.state, w.dk_panel

    def settle_at(scale):
        panel.slider.setValue(slider_from_dk(scale))
        qtbot.waitUntil(lambda: not st.busy and abs(st.result.dk_scale - scale) / scale < 0.02, timeout=30000)
        ent, _ = head_entropy_and_peak(st.result.attentions[st.layer])
        # side panels redraw right after the page has painted
        qtbot.waitUntil(lambda: panel.entropy is not None and np.allclose(panel.entropy, ent))
        return st.result.attentions.copy(), float(ent.mean()), panel.readout.text()

    a1, e1, _ = settle_at(1.0)
    a_hi, e_hi, text_hi = settle_at(20.0)
    a_lo, e_lo, text_lo = settle_at(0.05)
    assert not np.allclose(a1, a_hi) and not np.allclose(a1, a_lo)
    assert e_hi < e1 < e_lo  # sharper softmax -> fewer bits; flatter -> more
    assert "bits" in text_hi and text_hi != text_lo
    assert panel.slider.maximum() == DK_STEPS and panel.value.text() == "0.05×"
    # a uniform row over n keys has log2(n) bits; at 0.05× the rows approach it
    assert e_lo > 0.8 * np.log2(st.result.num_tokens)


def test_clicking_grid_cell_opens_that_head(make_window, qtbot):
    w = make_window(model="minilm", view="grid")
    qtbot.waitUntil(lambda: w.grid.last_image is not None)
    _click_scene(qtbot, w.grid.canvas, w.grid.cell_center(3, 7))
    qtbot.waitUntil(lambda: w.current_page_name == "head")
    assert (w.state.layer, w.state.head) == (3, 7)
    assert (w.layer_spin.value(), w.head_spin.value()) == (3, 7)
    np.testing.assert_array_equal(w.head_view.matrix, w.state.result.attentions[3, 7])


def test_arrow_keys_move_between_layers_and_heads(make_window, qtbot):
    w = make_window(model="minilm", view="grid")
    w.grid.canvas.setFocus()
    qtbot.keyClick(w.grid.canvas, Qt.Key_Down)
    qtbot.keyClick(w.grid.canvas, Qt.Key_Right)
    qtbot.keyClick(w.grid.canvas, Qt.Key_Right)
    assert (w.state.layer, w.state.head) == (1, 2)


def test_clicking_patch_changes_overlay(make_window, qtbot, sample_path):
    w = make_window(model="textbook-vit", image=sample_path, view="overlay")
    st, ov = w.state, w.overlay
    qtbot.waitUntil(lambda: ov.big_rgb is not None)
    assert st.query == 0  # [CLS] first
    before = ov.big_rgb.copy()
    rows, cols = st.result.grid
    _click_scene(qtbot, ov.canvas, ov.patch_center(rows // 2, cols // 3))
    off = st.result.patch_offset
    assert st.result.tokens[off] == "r0c0"
    assert st.query == off + (rows // 2) * cols + cols // 3
    assert not np.array_equal(before, ov.big_rgb)
    assert "patch row" in ov.caption.text() and "Untrained" in ov.caption.text()


def test_token_focus_hides_specials_and_renormalises(make_window, qtbot):
    w = make_window(model="minilm", view="tokens")
    tv, st = w.token_view, w.state
    qtbot.waitUntil(lambda: tv.rows is not None)
    tv.strip.setCurrentRow(2)  # click "animal"
    assert st.query == 2
    assert tv.rows.shape == (6 * 12, st.result.num_tokens)
    np.testing.assert_allclose(tv.rows[0], st.result.attentions[0, 0, 2])
    tv.hide_special.setChecked(True)
    assert tv.rows.shape[1] == st.result.num_tokens - 2
    np.testing.assert_allclose(tv.rows.sum(axis=1), 1.0, atol=1e-5)


def test_sequence_length_slider_cuts_tokens(make_window, qtbot):
    w = make_window(model="textbook")
    st, panel = w.state, w.seq_panel
    full = st.result.num_tokens
    st.set_max_tokens(5)
    qtbot.waitUntil(lambda: st.result.num_tokens == 5 and not st.busy, timeout=20000)
    qtbot.waitUntil(lambda: "5×5" in panel.readout.text())
    assert "FLOP" in panel.readout.text()
    assert panel.slider.maximum() == full
    st.set_max_tokens(8)
    qtbot.waitUntil(lambda: st.result.num_tokens == 8 and not st.busy, timeout=20000)
    qtbot.waitUntil(lambda: len(panel.live_points.getData()[0]) == 3)
    assert panel.fit is None and "no fit" in panel.no_fit_reason  # three lengths cannot carry a quadratic


def test_bad_image_shows_banner_and_keeps_last_view(make_window, qtbot, tmp_path):
    w = make_window(model="textbook-vit", image=sample())
    good = w.state.result
    bad = tmp_path / "not-an-image.png"
    bad.write_text("this is not a PNG")
    w.open_image(str(bad))
    qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=20000)
    assert w.banner.text and "\n" not in w.banner.text
    assert w.state.result is good and w.isVisible()
    w.banner.close_button.click()
    assert not w.banner.isVisible()


def test_bad_model_folder_shows_banner_and_keeps_model(make_window, qtbot, tmp_path):
    w = make_window(model="textbook")
    info, good = w.state.info, w.state.result
    (tmp_path / "empty-model").mkdir()
    w.open_model_folder(str(tmp_path / "empty-model"))
    qtbot.waitUntil(lambda: w.banner.isVisible() and not w.state.busy, timeout=20000)
    assert w.state.info is info and w.state.result is good
    # and the window still works afterwards
    w.state.set_text("still alive")
    qtbot.waitUntil(lambda: w.state.result is not good and not w.state.busy, timeout=20000)


def test_settings_keep_model_colormap_and_layout(make_window, qtbot, settings):
    w = make_window(model="textbook")
    w.cmap_combo.setCurrentText("magma")
    w.scale_combo.setCurrentText("log")
    w.close()
    assert settings.value("view/colormap") == "magma"
    assert settings.value("model/last") == "textbook"
    assert settings.value("window/state") is not None
    w2 = make_window(model="textbook")
    assert w2.state.colormap == "magma" and w2.state.log_scale and w2.cmap_combo.currentText() == "magma"


def test_export_png_svg_npz(make_window, qtbot, tmp_path):
    w = make_window(model="textbook")
    for ext in ("png", "svg", "npz"):
        out = w.export(str(tmp_path / f"view.{ext}"))
        assert out.stat().st_size > 100
    z = np.load(tmp_path / "view.npz", allow_pickle=False)
    r = w.state.result
    np.testing.assert_array_equal(z["attentions"], r.attentions)
    assert z["attentions"].dtype == np.float32 and z["tokens"].dtype.kind == "U"
    assert list(z["tokens"]) == r.tokens and str(z["model"]) == "textbook" and float(z["dk_scale"]) == 1.0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files left
    with pytest.raises(Exception):
        w.export(str(tmp_path / "missing-folder" / "x.png"))
    assert w.banner.isVisible()


def test_arrow_keys_still_move_the_text_cursor(make_window, qtbot):
    w = make_window(model="textbook")
    box = w.input_panel.text
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    before = box.textCursor().position()
    qtbot.keyClick(box, Qt.Key_Right)
    assert box.textCursor().position() == before + 1
    assert (w.state.layer, w.state.head) == (0, 0)



def test_counts_on_the_head_and_token_views_agree_with_what_is_drawn(make_window, qtbot):
    w = make_window(model="minilm", view="head")
    st = w.state
    qtbot.waitUntil(lambda: w.head_view.matrix is not None)
    N = st.result.num_tokens
    assert w.head_view.matrix.shape == (N, N) and f"{N}×{N} (all {N} tokens)" in w.head_view.title.text()
    st.set_options(hide_special=True)
    qtbot.waitUntil(lambda: not st.busy)
    n = N - int(np.sum(st.result.special))
    qtbot.waitUntil(lambda: w.head_view.matrix.shape == (n, n))
    assert f"{n}×{n}: {n} of {N} tokens, {N - n} special hidden" in w.head_view.title.text()
    w.show_page("tokens")
    tv = w.pages["tokens"]
    qtbot.waitUntil(lambda: tv.rows is not None and tv.rows.shape[1] == n)
    assert f"{n} of {N} tokens as keys" in tv.caption.text()


def test_the_chosen_patch_keeps_its_place_when_the_image_size_changes(make_window, qtbot):
    """The cat's eye stays the cat's eye: a new patch grid maps the chosen patch's centre, not its number."""
    w = make_window(model="textbook-vit", image=sample(), view="overlay")
    st, ov = w.state, w.overlay
    qtbot.waitUntil(lambda: ov.big_rgb is not None)
    r = st.result
    rows, cols = r.grid
    pr, pc = rows // 3, cols // 4
    _click_scene(qtbot, ov.canvas, ov.patch_center(pr, pc))
    assert st.query == r.patch_offset + pr * cols + pc
    side = r.image.shape[0]
    st.set_image_size(2 * side)
    qtbot.waitUntil(lambda: not st.busy and st.result.grid != (rows, cols), timeout=30000)
    r2 = st.result
    rows2, cols2 = r2.grid
    qr, qc = divmod(st.query - r2.patch_offset, cols2)
    assert (qr, qc) == (int((pr + 0.5) / rows * rows2), int((pc + 0.5) / cols * cols2))
    assert f"patch row {qr}, col {qc}" in ov.caption.text()
    st.set_image_size(side)  # and back: the same patch as first chosen
    qtbot.waitUntil(lambda: not st.busy and st.result.grid == (rows, cols), timeout=30000)
    assert divmod(st.query - r.patch_offset, cols) == (pr, pc)
    # a new picture starts again at [CLS]
    st.set_image(sample("coffee"))
    qtbot.waitUntil(lambda: not st.busy and st.result.image is not r.image, timeout=30000)
    assert st.query == 0


def test_the_overlay_uses_the_log_scale(make_window, qtbot):
    w = make_window(model="textbook-vit", image=sample(), view="overlay")
    st, ov = w.state, w.overlay
    qtbot.waitUntil(lambda: ov.big_rgb is not None)
    linear = ov.big_rgb.copy()
    assert ov.colorbar.levels()[0] == 0.0 and "log" not in ov.colorbar.axis.labelText
    st.set_options(log_scale=True)
    lo, hi = ov.colorbar.levels()
    assert hi - lo == pytest.approx(4.0) and "log₁₀ weight" in ov.colorbar.axis.labelText
    assert not np.array_equal(ov.big_rgb, linear) and "log₁₀ weight" in ov.caption.text()
