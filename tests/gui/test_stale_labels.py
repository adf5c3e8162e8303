"""Nothing on screen outlives what it describes: each label is cleared or redrawn by the event that
made it stale (a new result, a model switch, another image, a page switch)."""
from __future__ import annotations

from PySide6.QtCore import QPointF

from tests.gui.conftest import sample


def _hover(w, i, j):
    hv = w.head_view
    hv._hovered(hv.plot.vb.mapViewToScene(QPointF(j + 0.5, i + 0.5)))
    return hv.readout.text()


def test_hover_readout_is_cleared_by_new_attention(make_window, qtbot):
    w = make_window(model="textbook", view="head")
    st = w.state
    qtbot.waitUntil(lambda: w.head_view.matrix is not None)
    assert _hover(w, 1, 0).startswith('query "animal" → key "The"')
    st.set_dk_scale(5.0)
    qtbot.waitUntil(lambda: st.result.dk_scale == 5.0 and not st.busy, timeout=20000)
    assert w.head_view.readout.text() .startswith("Hover over the map")
    assert _hover(w, 1, 0).startswith('query "animal"')
    st.set_text("cats sleep")
    qtbot.waitUntil(lambda: st.result.tokens == ["cats", "sleep"], timeout=20000)
    assert w.head_view.readout.text() .startswith("Hover over the map")
    _hover(w, 1, 1)
    st.load_model("minilm")
    qtbot.waitUntil(lambda: st.info.name == "minilm" and st.result.model == "minilm", timeout=60000)
    assert w.head_view.readout.text() .startswith("Hover over the map")


def test_truncation_note_goes_when_nothing_is_cut(make_window, qtbot):
    w = make_window(model="textbook")
    st = w.state
    st.set_max_tokens(4)
    qtbot.waitUntil(lambda: st.result.num_tokens == 4 and not st.busy, timeout=20000)
    assert "truncated" in w.statusBar().currentMessage()
    st.set_max_tokens(None)
    qtbot.waitUntil(lambda: st.result.num_tokens == 12 and not st.busy, timeout=20000)
    assert st.result.notes == []
    assert "truncated" not in w.statusBar().currentMessage()
    assert "cut" not in w.input_panel.current.text()


def test_overlay_header_goes_when_back_to_text(make_window, qtbot):
    w = make_window(model="textbook-vit", image=sample("coffee"), view="overlay")
    st = w.state
    qtbot.waitUntil(lambda: "patches" in w.overlay.caption.text())
    st.set_text("back to words")
    qtbot.waitUntil(lambda: st.result.grid is None and not st.busy, timeout=60000)
    w.show_page("overlay")
    qtbot.waitUntil(lambda: w.overlay.isVisible())
    assert "patches" not in w.overlay.caption.text() and "Query" not in w.overlay.caption.text()


def test_sample_picker_follows_the_image_on_screen(make_window, qtbot):
    w = make_window(model="textbook-vit", image=sample("coffee"), view="overlay")
    st, picker = w.state, w.input_panel.samples
    i = picker.findText("astronaut")
    picker.setCurrentIndex(i)
    picker.activated.emit(i)
    qtbot.waitUntil(lambda: st.image.endswith("astronaut.jpg") and not st.busy, timeout=60000)
    assert picker.currentText() == "astronaut"
    w.open_image(sample("chelsea-cat"))  # File → Open image
    qtbot.waitUntil(lambda: not st.busy and "chelsea-cat" in w.input_panel.current.text(), timeout=60000)
    assert picker.currentText() == "chelsea-cat"
    st.set_text("now some text")
    qtbot.waitUntil(lambda: st.result.grid is None and not st.busy, timeout=60000)
    assert picker.currentIndex() == 0  # no sample on screen: the picker names none


def test_grid_header_describes_the_grid_drawn_during_a_model_switch(make_window, qtbot):
    w = make_window(model="textbook", view="grid")
    st = w.state
    seen = []
    st.model_loaded.connect(lambda info: seen.append((w.grid.title.text(), w.grid.last_image.shape)))
    st.load_model("minilm")
    qtbot.waitUntil(lambda: st.result.model == "minilm", timeout=60000)
    title, shape = seen[0]
    assert shape == (2 * 12, 4 * 12)  # textbook's 2 × 4 heads of 12 tokens are still drawn
    assert "6 layers × 12 heads" not in title  # the old textbook grid is still what is drawn
    assert "minilm" in w.grid.title.text() and "6 layers × 12 heads" in w.grid.title.text()


def test_page_switch_clears_the_render_time(make_window, qtbot):
    w = make_window(model="textbook", view="grid")
    st = w.state
    qtbot.waitUntil(lambda: w.status_labels["render"].text().startswith("render"), timeout=10000)
    w.show_page("overlay")  # a text model: the overlay shows its placeholder, no heatmap paints
    st.set_text("a new sentence arrives")
    qtbot.waitUntil(lambda: st.result.tokens[0] == "a" and not st.busy, timeout=20000)
    got = []
    w.frame_painted.connect(got.append)
    with qtbot.waitSignal(w.head_view.canvas.painted, timeout=10000):  # the head page's first paint
        w.show_page("head")
    assert w.head_view.matrix is not None and w.head_view.matrix.shape[0] == 4
    assert got == []  # the paint after a page switch is not a result's render time
    assert w.status_labels["render"].text() == ""


def test_a_failed_first_load_does_not_keep_saying_loading(qtbot, settings):
    import argparse

    from attn_explorer.errors import UserError
    from attn_explorer.gui.window.app import build_window, get_qapp

    get_qapp()

    def failing_loader(src, device="cpu", progress=None, want_image=False):
        raise UserError(f"model {src!r} not found")

    args = argparse.Namespace(model="nope", text=None, image=None, device="cpu", view=None, screenshot=None)
    w, st = build_window(args, settings=settings, loader=failing_loader)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=20000)
    for page in ("grid", "head", "tokens"):
        text = w.pages[page].placeholder.text()
        assert "Loading" not in text and "No model" in text, (page, text)
    assert "Loading" not in w.dk_panel.readout.text() and "Loading" not in w.overlay.placeholder.text()
    assert "loading" not in w.grid.title.text()
    st.shutdown()


def test_loaded_model_with_empty_text_says_so_not_loading(make_window, qtbot):
    """Empty text: once the model is loaded, no page may still say it is loading (it said so for ever)."""
    w = make_window(model="textbook", text="", wait=False)
    qtbot.waitUntil(lambda: w.state.info is not None and not w.state.busy, timeout=60000)
    assert w.state.result is None
    for name in ("grid", "head", "tokens"):
        msg = w.pages[name].stack.placeholder.text()
        assert "Loading" not in msg and "type or paste some text" in msg, (name, msg)
    assert "is loaded" in w.grid.title.text()
    assert "Loading" not in w.dk_panel.readout.text()
    qtbot.waitUntil(lambda: "No input" in w.input_panel.current.text(), timeout=5000)  # the side panel too


def test_the_text_box_follows_the_sessions_text_and_keeps_the_next_keystroke(make_window, qtbot):
    """A lesson's "Use the primer's sentence" calls state.set_text: the box shows it, and typing goes on from it."""
    from PySide6.QtCore import Qt

    w = make_window(model="textbook")
    st, box = w.state, w.input_panel.text
    st.set_text("the cat sat")
    assert box.toPlainText() == "the cat sat"
    qtbot.waitUntil(lambda: st.result.tokens == ["the", "cat", "sat"] and not st.busy, timeout=20000)
    box.setFocus()
    box.moveCursor(box.textCursor().MoveOperation.End)
    qtbot.keyClicks(box, " down")
    qtbot.waitUntil(lambda: st.text == "the cat sat down", timeout=5000)  # the box's own edit, sent once
    assert box.toPlainText() == "the cat sat down" and box.textCursor().position() == len("the cat sat down")
    qtbot.waitUntil(lambda: st.result.tokens[-1] == "down" and not st.busy, timeout=20000)
    cursor = box.textCursor()
    cursor.setPosition(3)  # typing in the middle: the session's echo must not move the cursor
    box.setTextCursor(cursor)
    qtbot.keyClick(box, Qt.Key_X)
    qtbot.waitUntil(lambda: st.text == "thex cat sat down", timeout=5000)
    assert box.textCursor().position() == 4


def test_clearing_the_text_shows_the_empty_state_everywhere(make_window, qtbot):
    w = make_window(model="textbook", view="grid")
    st = w.state
    qtbot.waitUntil(lambda: "tokens" in w.input_panel.current.text() and not st.busy, timeout=20000)
    w.show_page("head")  # the page on screen when the box is cleared (a user's walk found its header stale)
    qtbot.waitUntil(lambda: "tokens" in w.pages["head"].title.text(), timeout=10000)
    with qtbot.waitSignal(st.input_cleared, timeout=10000):
        w.input_panel.text.setPlainText("")
    qtbot.waitUntil(lambda: "No input" in w.input_panel.current.text(), timeout=5000)
    for name in ("grid", "head", "tokens"):
        page = w.pages[name]
        assert page.stack.currentWidget() is page.placeholder, name
        assert "type or paste some text" in page.placeholder.text(), name
    assert "tokens" not in w.grid.title.text() and "is loaded" in w.grid.title.text()
    assert "tokens" not in w.pages["head"].title.text()  # the one-head header described the map that went
    assert w.status_labels["tokens"].text() == "" and w.seq_panel.readout.text() == ""
    assert not w.seq_panel.slider.isEnabled() and not w.dk_panel.plot.isVisible()
    w.input_panel.text.setPlainText("cats sleep")
    qtbot.waitUntil(lambda: st.result is not None and st.result.tokens == ["cats", "sleep"], timeout=20000)
    qtbot.waitUntil(lambda: w.grid.stack.currentWidget() is w.grid.canvas and "2 tokens" in w.input_panel.current.text())


def test_the_side_panel_counts_the_tokens_the_maps_show(make_window, qtbot):
    w = make_window(model="minilm", text="cats sleep on warm mats")
    st = w.state
    n = st.result.num_tokens
    qtbot.waitUntil(lambda: f"Showing text: {n} tokens" in w.input_panel.current.text(), timeout=10000)
    w.hide_special_box.setChecked(True)
    qtbot.waitUntil(lambda: st.grid_image is not None and st.grid_image.hidden_specials, timeout=20000)
    qtbot.waitUntil(lambda: f"{n - 2} tokens shown (2 special hidden)" in w.input_panel.current.text(), timeout=5000)
    assert f"{n - 2} tokens shown (2 special hidden" in w.grid.title.text()
    assert f"{n} tokens" not in w.grid.title.text().replace(f"{n - 2} tokens", "")


def test_a_failed_run_on_a_new_model_is_not_called_running_and_a_later_success_clears_the_banner(
        make_window, qtbot, monkeypatch):
    from attn_explorer.errors import UserError
    from attn_explorer.session import host as host_module

    w = make_window(model="textbook", view="grid")
    st = w.state
    real = host_module.run_job

    def refuse_minilm(model, x, kw, hide=False, *args, **more):  # more: the run's stack, progress, partial maps
        if model.info.name == "minilm" and x.startswith("long"):
            raise UserError("5,541 tokens would need 33.2 GB: use fewer tokens")
        return real(model, x, kw, hide, *args, **more)

    monkeypatch.setattr(host_module, "run_job", refuse_minilm)
    st.set_text("long text here")
    qtbot.waitUntil(lambda: st.result.tokens[0] == "long" and not st.busy, timeout=20000)
    st.load_model("minilm")
    qtbot.waitUntil(lambda: w.banner.isVisible() and st.info.name == "minilm" and not st.busy, timeout=60000)
    title = w.grid.title.text()
    assert "running" not in title and "textbook" in title and "has not run" in title
    assert w.status_labels["model"].text() == "minilm" and w.status_labels["tokens"].text() == ""  # not textbook's n
    st.set_text("short now")
    qtbot.waitUntil(lambda: st.result.model == "minilm" and not st.busy, timeout=20000)
    assert not w.banner.isVisible()  # the error described the run before this one
    assert "has not run" not in w.grid.title.text()
