"""Window chrome a user relies on: keyboard shortcuts, the status bar, the non-modal error banner,
and the overlay placing patches where the result says they start."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from attn_explorer.gui.window import actions
from attn_explorer.gui.widgets.overlay import patch_heat
from attn_explorer.api.result import RunResult
from tests.gui.conftest import sample


def _key(qtbot, w, key, mod=Qt.NoModifier):
    w.grid.canvas.setFocus()
    qtbot.keyClick(w.grid.canvas, key, mod)


def test_ctrl_i_opens_an_image(make_window, qtbot, monkeypatch):
    w = make_window(model="textbook")
    asked = []

    def fake_open(parent, title, folder, filters):
        asked.append(title)
        return sample("coffee"), ""

    monkeypatch.setattr(actions.QFileDialog, "getOpenFileName", fake_open)
    _key(qtbot, w, Qt.Key_I, Qt.ControlModifier)  # Ctrl+O opens a session (tests/gui/test_sessions.py)
    assert asked == ["Open image"]
    qtbot.waitUntil(lambda: w.state.result.grid is not None and not w.state.busy, timeout=60000)
    assert w.state.image.endswith("coffee.jpg") and w.current_page_name == "overlay"  # image models open there


def test_ctrl_e_exports_the_current_page(make_window, qtbot, monkeypatch, tmp_path):
    w = make_window(model="textbook")
    out = tmp_path / "shot"
    monkeypatch.setattr(actions.QFileDialog, "getSaveFileName",
                        lambda *a: (str(out), actions.FORMATS[".png"]))
    _key(qtbot, w, Qt.Key_E, Qt.ControlModifier)  # Ctrl+S saves the session (tests/gui/test_sessions.py)
    png = tmp_path / "shot.png"  # the chosen filter's extension is added
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    assert "saved" in w.statusBar().currentMessage()


def test_ctrl_q_closes_the_window(make_window, qtbot, settings):
    w = make_window(model="textbook")
    _key(qtbot, w, Qt.Key_Q, Qt.ControlModifier)
    qtbot.waitUntil(lambda: not w.isVisible())
    assert settings.value("window/geometry") is not None  # closing saved the layout


def test_ctrl_number_switches_pages(make_window, qtbot):
    w = make_window(model="textbook")
    _key(qtbot, w, Qt.Key_2, Qt.ControlModifier)
    assert w.current_page_name == "head"
    w.head_view.canvas.setFocus()
    qtbot.keyClick(w.head_view.canvas, Qt.Key_3, Qt.ControlModifier)
    assert w.current_page_name == "tokens"


def test_arrow_keys_stop_at_the_edges(make_window, qtbot):
    w = make_window(model="textbook")  # 2 layers × 4 heads
    for k in (Qt.Key_Up, Qt.Key_Left):
        _key(qtbot, w, k)
    assert (w.state.layer, w.state.head) == (0, 0)
    for k in (Qt.Key_Down, Qt.Key_Down, Qt.Key_Down) + (Qt.Key_Right,) * 6:
        _key(qtbot, w, k)
    assert (w.state.layer, w.state.head) == (1, 3)
    assert (w.layer_spin.value(), w.head_spin.value()) == (1, 3)
    _key(qtbot, w, Qt.Key_Up)
    _key(qtbot, w, Qt.Key_Left)
    assert (w.state.layer, w.state.head) == (0, 2)


def test_status_bar_names_model_device_length_and_times(make_window, qtbot):
    w = make_window(model="textbook")
    qtbot.waitUntil(lambda: w.status_labels["render"].text().startswith("render"), timeout=10000)
    s = {k: lab.text() for k, lab in w.status_labels.items()}
    assert s["model"] == "textbook (untrained)" and s["device"] == "cpu · float32"
    assert s["tokens"] == f"n = {w.state.result.num_tokens}" and s["forward"].endswith(" ms")
    assert "untrained" in w.windowTitle()


def test_errors_go_to_a_banner_not_a_dialog(make_window, qtbot):
    w = make_window(model="textbook")
    w.state.set_text("   ")  # nothing to run: the empty state, no error
    w.state.error_raised.emit("something went wrong")
    assert w.banner.isVisible() and "something went wrong" in w.banner.text
    assert QApplication.activeModalWidget() is None
    assert "something went wrong" in w.statusBar().currentMessage()
    w.state.set_text("typing still works")
    qtbot.waitUntil(lambda: w.state.result is not None and w.state.result.tokens == ["typing", "still", "works"],
                    timeout=20000)
    assert not w.banner.isVisible()  # the run asked for after the error succeeded: the banner went


def test_overlay_uses_the_results_patch_offset(make_window, qtbot):
    # [CLS], four patches, then a trailing extra token: the patches are not the last rows·cols tokens
    w = make_window(model="textbook-vit", image=sample("coffee"), view="overlay")
    st, ov = w.state, w.overlay
    real = st.result
    N = 6
    att = np.full((1, 1, N, N), 0.0, np.float32)
    att[..., 1] = 1.0  # every query looks at patch r0c0 only
    r = RunResult(attentions=att, tokens=["[CLS]", "r0c0", "r0c1", "r1c0", "r1c1", "[END]"],
                  special=np.array([1, 0, 0, 0, 0, 1], bool), model=real.model, dk_scale=1.0, forward_ms=1.0,
                  grid=(2, 2), image=real.image, total_tokens=N, patch_offset=1)
    np.testing.assert_array_equal(patch_heat(att[0, 0, 0], (2, 2), 1), [[1, 0], [0, 0]])
    st.layer = st.head = st.query = 0
    st.result = r
    st.attention_ready.emit(r)
    heat = ov.big_rgb.astype(float) - r.image.astype(float)
    h, wd = r.image.shape[:2]
    assert np.abs(heat[: h // 2, : wd // 2]).mean() > 10 * np.abs(heat[h // 2:, wd // 2:]).mean() + 1
    _click = ov.patch_center(1, 1)
    from tests.gui.test_explorer import _click_scene

    _click_scene(qtbot, ov.canvas, _click)
    assert st.query == 4  # r1c1 is token 1 + 1·2 + 1


def test_ctrl_shift_o_reads_a_text_file_and_runs_it(make_window, qtbot, monkeypatch, tmp_path):
    w = make_window(model="textbook")
    qtbot.waitUntil(lambda: w.state.result is not None and not w.state.busy, timeout=60000)
    f = tmp_path / "story.txt"
    f.write_text("the quick brown fox jumps", encoding="utf-8")
    monkeypatch.setattr(actions.QFileDialog, "getOpenFileName", lambda *a: (str(f), ""))
    _key(qtbot, w, Qt.Key_O, Qt.ControlModifier | Qt.ShiftModifier)
    qtbot.waitUntil(lambda: w.state.result.tokens == ["the", "quick", "brown", "fox", "jumps"], timeout=60000)
    assert w.input_panel.text.toPlainText() == "the quick brown fox jumps"


def test_bad_text_files_show_a_banner_and_keep_the_view(make_window, qtbot, tmp_path):
    w = make_window(model="textbook")
    qtbot.waitUntil(lambda: w.state.result is not None and not w.state.busy, timeout=60000)
    before = w.state.result
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("  \n")
    for name, message in (("latin1.txt", "not UTF-8"), ("empty.txt", "empty"), ("missing.txt", "not found")):
        assert not w.open_text_file(str(tmp_path / name))
        assert message in w.banner.label.text() and w.banner.isVisible()
        assert message in w.statusBar().currentMessage()
    assert w.state.result is before and w.isVisible()


def test_arrow_keys_work_as_soon_as_the_window_shows(make_window, qtbot):
    """No map clicked first: the arrows step layers and heads from the start (they did nothing until a map had
    the focus, because the text box took it and kept the arrows)."""
    w = make_window(model="textbook")  # 2 layers × 4 heads
    qtbot.waitExposed(w)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is not None)
    target = QApplication.focusWidget()
    page = w.pages[w.current_page_name]
    assert target is page or page.isAncestorOf(target), target  # the keys are on the page, not the text box
    qtbot.keyClick(target, Qt.Key_Down)
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Right)
    assert (w.state.layer, w.state.head) == (1, 1)


def test_arrow_keys_in_the_text_box_move_its_cursor_not_the_head(make_window, qtbot):
    w = make_window(model="textbook")
    box = w.input_panel.text
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    cursor = box.textCursor()
    cursor.setPosition(3)
    box.setTextCursor(cursor)
    qtbot.keyClick(box, Qt.Key_Right)
    qtbot.keyClick(box, Qt.Key_Down)
    assert (w.state.layer, w.state.head) == (0, 0)
    assert box.textCursor().position() > 4  # right, then down to the end of the (one-line) text
    qtbot.keyClick(box, Qt.Key_X)
    assert "x" in box.toPlainText()


def test_every_top_level_tab_is_visible_at_1024_px(make_window, qtbot):
    w = make_window(model="textbook")
    w.resize(1024, 700)
    qtbot.waitUntil(lambda: w.width() == 1024)
    bar = w.tabs.tabBar()
    qtbot.waitUntil(lambda: bar.isVisible() and bar.width() > 0)
    visible = bar.rect()
    for i in range(bar.count()):
        rect = bar.tabRect(i)
        assert visible.contains(rect), (bar.tabText(i), rect, visible)
        assert bar.tabText(i) == w.tabs.tabText(i)  # not elided


FIRST_WINDOW = r"""
import argparse, sys
from attn_explorer.gui.window.app import build_window, get_qapp, make_settings
app = get_qapp()
def loader(*a, **k):
    raise RuntimeError("no model in this test")
args = argparse.Namespace(model="minilm", text=None, image=None, device="cpu", view=None)
window, state = build_window(args, settings=make_settings(sys.argv[1]), loader=loader)
window.show()
for _ in range(20):
    app.processEvents()
avail = window.screen().availableGeometry()
print(avail.width(), avail.height(), window.width(), window.height())
state.shutdown()
"""


def _first_window(tmp_path, width, height):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    conf = tmp_path / "screen.json"
    conf.write_text(json.dumps({"screens": [{"name": "s", "x": 0, "y": 0, "width": width, "height": height,
                                             "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}))
    env = dict(os.environ, QT_QPA_PLATFORM=f"offscreen:configfile={conf}")
    proc = subprocess.run([sys.executable, "-c", FIRST_WINDOW, str(tmp_path / "s.ini")],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [int(v) for v in proc.stdout.split()[-4:]]


def test_the_first_window_takes_most_of_a_large_screen(tmp_path):
    aw, ah, w, h = _first_window(tmp_path, 1920, 1080)
    assert (aw, ah) == (1920, 1080)
    assert abs(w - 0.8 * aw) <= 2 and abs(h - 0.8 * ah) <= 2, (w, h)


def test_the_first_window_is_at_least_1024_by_700_but_never_larger_than_the_screen(tmp_path):
    aw, ah, w, h = _first_window(tmp_path, 1280, 800)
    assert (w, h) == (1024, 700)
    aw, ah, w, h = _first_window(tmp_path, 900, 650)
    assert w <= aw and h <= ah and w >= 0.8 * aw


def test_after_choosing_a_model_the_arrows_step_heads_not_models(make_window, qtbot):
    w = make_window(model="textbook")
    combo = w.model_combo
    combo.setFocus()
    i = combo.findData("textbook")
    combo.setCurrentIndex(i)
    combo.activated.emit(i)  # the user picked it
    qtbot.waitUntil(lambda: not combo.hasFocus() and not w.state.busy, timeout=20000)
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Right)
    assert w.state.head == 1 and w.state.info.name == "textbook" and combo.currentData() == "textbook"


def test_grid_head_labels_do_not_overlap_on_a_tall_model_at_1024_px(make_window, qtbot):
    """30 layers × 9 heads (SmolLM2's shape) at 1024×700: cells are narrower than "H8"; every other label."""
    from attn_explorer.api.display import grid_image

    w = make_window(model="textbook", view="grid")
    w.resize(1024, 700)
    st, grid = w.state, w.grid
    att = np.full((30, 9, 6, 6), 1 / 6, np.float32)
    r = RunResult(attentions=att, tokens=[f"t{i}" for i in range(6)], special=np.zeros(6, bool), model="textbook",
                  dk_scale=1.0, forward_ms=1.0, total_tokens=6, display=grid_image(att))
    st.result = r
    st.attention_ready.emit(r)

    def spaced() -> bool:
        import pyqtgraph as pg

        ticks = grid.plot.getAxis("top")._tickLevels[0]  # the labels drawn (pyqtgraph keeps them here)
        if len(ticks) < 2:
            return False
        xs = [grid.plot.vb.mapViewToScene(pg.Point(x, 0)).x() for x, _ in ticks]
        room = grid.fontMetrics().horizontalAdvance("H8")
        return min(b - a for a, b in zip(xs, xs[1:])) >= room

    qtbot.waitUntil(spaced, timeout=5000)


def test_the_first_run_of_a_model_is_marked_as_warm_up_in_the_status_bar(qtbot, settings):
    """A first pass's start-up costs (251 ms against 11 ms for the next) are not shown as the forward time."""
    import argparse

    import attn_explorer as ax
    from attn_explorer.gui.window.app import build_window, get_qapp
    from attn_explorer.session.state import Loaded

    def fresh(src, device="cpu", progress=None, want_image=False):  # a model object that has never run
        m = ax.load_model("textbook", device="cpu")
        return Loaded(model=m, info=m.info)

    get_qapp()
    args = argparse.Namespace(model="textbook", text=None, image=None, device="cpu", view="grid", screenshot=None)
    w, st = build_window(args, settings=settings, loader=fresh)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: st.result is not None, timeout=60000)
    label = w.status_labels["forward"]
    assert st.result.warm_up and "warm-up" in label.text() and st.timings == []
    assert "warm-up" in w.seq_panel.readout.text()
    st.set_text("the animal was too tired to cross")
    qtbot.waitUntil(lambda: st.result is not None and not st.result.warm_up, timeout=60000)
    assert "warm-up" not in label.text() and label.text().startswith("forward ")
    assert "warm-up" not in w.seq_panel.readout.text()
    assert len(st.timings) == 1  # only the warm run is a point of the cost plot
    st.shutdown()


def test_a_closed_window_hears_nothing_from_its_session(make_window, qtbot):
    """A job ending after the window closed (its busy flag, a queued result) reached the closed window's
    deleted widgets: 'Internal C++ object (QLabel) already deleted', in whichever test ran next."""
    w = make_window(model="textbook")
    st, r = w.state, w.state.result
    heard = []
    st.attention_ready.connect(heard.append)
    st.busy_changed.connect(heard.append)
    w.close()  # closeEvent shuts the session down
    st.runner.busy_changed.emit(True)  # what the runner says when the job in flight ends
    st.attention_ready.emit(r)
    assert heard == []
