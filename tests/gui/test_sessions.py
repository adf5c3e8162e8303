"""File → Save session / Open session / Open saved run, and ax.open: the same view comes back (same maps,
selection, sliders, page and options), a saved run shows its maps without the model and says so, and
every problem is one line in the banner while the last good view stays."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from attn_explorer.gui.window.app import build_window, get_qapp
from attn_explorer.session.jobs import default_loader
from tests.gui.conftest import cached_loader, sample
from tests.tiny_llama import make_llama_folder

TEXT = "The capital of France is Paris because it is"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("tiny") / "llama", seed=3)


def _window(qtbot, settings, loader=default_loader, **kw):
    get_qapp()
    args = argparse.Namespace(**{"model": None, "text": None, "image": None, "device": "cpu", "view": None,
                                 "screenshot": None, "session": None, "open": None, **kw})
    window, state = build_window(args, settings=settings, loader=loader)
    qtbot.addWidget(window)
    window.resize(1300, 850)
    window.show()
    qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=60000)
    return window, state


def _settle(qtbot, state):
    qtbot.waitUntil(lambda: not state.busy, timeout=60000)


def test_a_session_survives_save_and_open(qtbot, settings, tiny_folder, tmp_path):
    w, st = _window(qtbot, settings, model=str(tiny_folder), text=TEXT)
    with qtbot.waitSignal(st.attention_ready, timeout=60000):
        st.set_dk_scale(1.7, layer_only=False)
    with qtbot.waitSignal(st.attention_ready, timeout=60000):
        st.set_max_tokens(7)
    st.select(layer=1, head=4)
    st.set_query(5)
    with qtbot.waitSignal(st.attention_ready, timeout=60000):
        st.set_options(colormap="magma", log_scale=True, hide_special=True)
    w.show_page("tokens")
    maps = st.result.attentions.copy()
    path = w.save_session(str(tmp_path / "mine"))
    assert path.suffix == ".axsession"
    st.shutdown()

    w2, st2 = _window(qtbot, settings, session=str(path))
    _settle(qtbot, st2)
    assert st2.info.name == str(tiny_folder) and st2.text == TEXT
    # the reopened run is a new process's first forward: float32 kernels may round it apart (1.07e-6 on an Intel Xeon)
    np.testing.assert_allclose(st2.result.attentions, maps, atol=1e-5, rtol=0)
    assert st2.result.num_tokens == 7 and st2.max_tokens == 7 and st2.dk_scale == pytest.approx(1.7)
    assert (st2.layer, st2.head, st2.query) == (1, 4, 5)
    assert (w2.layer_spin.value(), w2.head_spin.value()) == (1, 4)
    assert (st2.colormap, st2.log_scale, st2.hide_special) == ("magma", True, True)
    assert w2.cmap_combo.currentText() == "magma" and w2.hide_special_box.isChecked()
    assert w2.current_page_name == "tokens"
    from attn_explorer.gui.explorer.controls import slider_from_dk

    assert w2.dk_panel.slider.value() == slider_from_dk(1.7)  # the slider shows the restored d_k
    assert w2.input_panel.text.toPlainText() == TEXT


def _good_view(w, st):
    return st.result, st.text, (st.layer, st.head, st.query), w.current_page_name, st.info


def test_a_damaged_session_is_refused_and_changes_nothing(qtbot, make_window, tmp_path):
    w = make_window(model="textbook", text="the cat sat on the mat")
    st = w.state
    st.select(layer=1, head=2)
    before = _good_view(w, st)
    good = w.save_session(str(tmp_path / "good.axsession"))
    bad = tmp_path / "bad.axsession"
    bad.write_bytes(good.read_bytes()[:40])
    assert not w.open_session(str(bad))
    assert "bad.axsession is damaged" in w.banner.text and not st.busy
    assert _good_view(w, st) == before


def test_each_problem_gets_its_line(qtbot, make_window, tmp_path):
    w = make_window(model="textbook", text="the cat sat on the mat")
    st = w.state
    before = _good_view(w, st)
    d = json.loads(w.save_session(str(tmp_path / "s.axsession")).read_text(encoding="utf-8"))
    newer = tmp_path / "newer.axsession"
    newer.write_text(json.dumps({**d, "version": 99}), encoding="utf-8")
    assert not w.open_session(str(newer))
    assert "newer attn-explorer" in w.banner.text
    gone = tmp_path / "gone.axsession"
    gone.write_text(json.dumps({**d, "model": {**d["model"], "source": str(tmp_path / "no-such-model")}}),
                    encoding="utf-8")
    assert not w.open_session(str(gone))
    assert "no-such-model is missing" in w.banner.text
    assert _good_view(w, st) == before
    unknown = tmp_path / "unknown.axsession"  # a name only loading can find out about
    unknown.write_text(json.dumps({**d, "page": "head", "model": {**d["model"], "source": "no-such-builtin-xyz"}}),
                       encoding="utf-8")
    with qtbot.waitSignal(st.error_raised, timeout=60000) as sig:
        assert w.open_session(str(unknown))
    assert sig.args[0].startswith("cannot open the session: its model did not load")
    _settle(qtbot, st)
    assert _good_view(w, st) == before and st.has_model


def test_a_changed_image_opens_as_it_is_now_with_a_line(qtbot, make_window, tmp_path):
    from PIL import Image

    img = tmp_path / "cat.png"
    Image.open(sample()).convert("RGB").save(img)
    w = make_window(model="textbook-vit", image=str(img))
    path = w.save_session(str(tmp_path / "img.axsession"))
    Image.open(img).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(img)
    w.state.set_text("the cat sat")  # somewhere else, so the session has something to bring back
    _settle(qtbot, w.state)
    with qtbot.waitSignal(w.state.error_raised, timeout=60000) as sig:
        assert w.open_session(str(path))
    assert "cat.png changed since the session was saved" in sig.args[0]
    _settle(qtbot, w.state)
    assert w.state.input_kind == "image" and w.state.result.grid is not None
    assert w.banner.isVisible() and "changed since" in w.banner.text  # its result's arrival did not hide it
    img.unlink()
    assert not w.open_session(str(path))
    assert "cat.png is missing" in w.banner.text


def test_a_saved_run_opens_without_its_model_on_its_page(qtbot, make_window, settings, tmp_path):
    w = make_window(model="textbook", text="the cat sat on the mat because it was tired")
    st = w.state
    st.select(layer=1, head=3)
    st.set_query(4)
    w.show_page("head")
    run_file = w.export(str(tmp_path / "run.npz"))
    maps = st.result.attentions.copy()
    st.shutdown()

    import attn_explorer as ax

    w2 = ax.open(str(run_file))  # a QApplication is running: the window comes back at once
    qtbot.addWidget(w2)
    st2 = w2.state
    qtbot.waitUntil(lambda: st2.result is not None and st2.result.display is not None, timeout=30000)
    np.testing.assert_array_equal(st2.result.attentions, maps)
    assert not st2.has_model and st2.result_only == "run.npz"
    assert (st2.layer, st2.head, st2.query) == (1, 3, 4) and w2.current_page_name == "head"
    assert w2.saved_run_line.isVisible() and "model is not loaded" in w2.saved_run_line.text()
    assert not w2.dk_panel.isEnabled() and not w2.input_panel.isEnabled()
    assert w2.input_panel.text.toPlainText() == "the cat sat on the mat because it was tired"
    assert "not timed" in w2.status_labels["forward"].text()
    shown = st2.result
    with qtbot.waitSignal(st2.error_raised, timeout=5000) as sig:
        st2.set_dk_scale(3.0)
    assert "opened without its model" in sig.args[0] and st2.result is shown and st2.dk_scale == 1.0
    with qtbot.waitSignal(st2.attention_ready, timeout=30000):  # drawing options still work: pooled again
        st2.set_options(hide_special=True)
    assert st2.result is not shown and st2.result_only
    with qtbot.waitSignal(st2.attention_ready, timeout=60000):  # choosing the model leaves the saved run
        w2.toolbar.model_chosen(w2.model_combo.findData("textbook"))
    assert st2.has_model and not st2.result_only and not w2.saved_run_line.isVisible()
    assert w2.dk_panel.isEnabled() and w2.seq_panel.isVisible() and "not timed" not in w2.status_labels["forward"].text()
    np.testing.assert_allclose(st2.result.attentions, maps, atol=1e-6)  # the same text, run again
    st2.shutdown()


def test_a_damaged_run_file_changes_nothing(qtbot, make_window, tmp_path):
    w = make_window(model="textbook", text="the cat sat on the mat")
    st = w.state
    before = _good_view(w, st)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    assert w.open_saved_run(str(bad))  # read in a worker: its answer is the banner
    qtbot.waitUntil(lambda: "bad.npz is damaged" in w.banner.text, timeout=10000)
    assert _good_view(w, st) == before and st.has_model and not w.saved_run_line.isVisible()


def test_ax_open_takes_a_result_in_memory(qtbot, settings):
    from attn_explorer.api.result import RunResult
    from attn_explorer.gui.window.app import open_window

    rng = np.random.default_rng(1)
    a = rng.random((2, 2, 4, 4)).astype(np.float32)
    a /= a.sum(-1, keepdims=True)
    r = RunResult(attentions=a, tokens=["a", "b", "c", "d"], special=np.zeros(4, bool), model="mine",
                  dk_scale=1.0, forward_ms=2.5)
    get_qapp()
    settings.setValue("model/last_text", "minilm")
    w = open_window(r, view="tokens", settings=settings, loader=cached_loader)
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.state.result is not None, timeout=30000)
    np.testing.assert_array_equal(w.state.result.attentions, a)
    assert w.current_page_name == "tokens" and "a result in memory" in w.saved_run_line.text()
    # the next start opens the last model really loaded, not the saved run's
    assert settings.value("model/last_text") == "minilm" and settings.value("model/last") is None
    w.state.shutdown()


def test_ctrl_s_saves_the_session_and_ctrl_o_opens_one(qtbot, make_window, monkeypatch, tmp_path):
    from PySide6.QtCore import Qt

    from attn_explorer.gui.window import sessions

    w = make_window(model="textbook", text="the cat sat on the mat")
    target = tmp_path / "keys.axsession"
    monkeypatch.setattr(sessions.QFileDialog, "getSaveFileName", lambda *a: (str(target), ""))
    w.grid.canvas.setFocus()
    qtbot.keyClick(w.grid.canvas, Qt.Key_S, Qt.ControlModifier)
    assert target.is_file() and "saved session" in w.statusBar().currentMessage()
    w.state.select(layer=1, head=3)
    monkeypatch.setattr(sessions.QFileDialog, "getOpenFileName", lambda *a: (str(target), ""))
    with qtbot.waitSignal(w.state.attention_ready, timeout=60000):
        qtbot.keyClick(w.grid.canvas, Qt.Key_O, Qt.ControlModifier)
    assert (w.state.layer, w.state.head) == (0, 0)  # the saved selection came back


def test_open_saved_run_from_the_menu_reads_in_a_worker(qtbot, make_window, monkeypatch, tmp_path):
    from attn_explorer.gui.window import sessions

    w = make_window(model="textbook", text="the cat sat on the mat")
    st = w.state
    st.select(layer=1, head=1)
    w.show_page("tokens")
    path = w.export(str(tmp_path / "menu.npz"))
    st.select(layer=0, head=0)
    w.show_page("grid")
    monkeypatch.setattr(sessions.QFileDialog, "getOpenFileName", lambda *a: (str(path), ""))
    with qtbot.waitSignal(st.saved_run_shown, timeout=30000):
        w.act_open_run.trigger()
    assert st.result_only == "menu.npz" and not st.has_model
    assert (st.layer, st.head) == (1, 1) and w.current_page_name == "tokens"
