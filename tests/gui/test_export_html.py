"""File → Export page as HTML…: the page of the result, view and selection on screen, built and written in a
worker; a path it cannot write is one banner line, and the view stays."""
from __future__ import annotations

import threading

import numpy as np
from PySide6.QtWidgets import QFileDialog

from attn_explorer.api.html import page_weights, read_page_data
from attn_explorer.session import html_export


def _menu_action(w, text):
    file_menu = w.menuBar().actions()[0].menu()
    return next(a for a in file_menu.actions() if a.text() == text)


def test_menu_writes_the_page_of_what_is_on_screen_in_a_worker(qtbot, make_window, tmp_path, monkeypatch):
    w = make_window(model="textbook", text="the cat sat on the mat because it was warm")
    st = w.state
    w.show_page("head")
    st.select(layer=1, head=2)
    st.set_query(3)
    threads = []
    real = html_export.page_html

    def spy(*a, **kw):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(*a, **kw)

    monkeypatch.setattr(html_export, "page_html", spy)
    out = tmp_path / "page"  # the dialog's answer without a suffix: .html is added
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), "Web page (*.html)"))
    _menu_action(w, "Export page as &HTML…").trigger()
    page = tmp_path / "page.html"
    qtbot.waitUntil(lambda: "saved" in w.statusBar().currentMessage(), timeout=30000)
    assert threads == [False]  # built in a worker, never on the GUI thread
    d = read_page_data(page.read_text(encoding="utf-8"))
    assert (d["view"], d["layer"], d["head"], d["query"]) == ("head", 1, 2, 3)
    exact = st.result.attentions
    half = np.asarray(d["maps"]["scale"])[:, :, None, None] / 510
    assert (np.abs(page_weights(d) - exact) <= half + 1e-6).all()
    assert [p.name for p in tmp_path.iterdir() if "page" in p.name] == ["page.html"]  # no temporary left


def test_a_folder_that_does_not_exist_is_one_banner_line(qtbot, make_window, tmp_path):
    w = make_window(model="textbook", text="the cat sat")
    before = w.state.result
    assert w.export_html(str(tmp_path / "missing" / "page.html"))
    qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=30000)
    assert "output folder does not exist" in w.banner.text and "\n" not in w.banner.text
    assert w.state.result is before and not (tmp_path / "missing").exists()


def test_nothing_to_export_says_so(qtbot, make_window):
    w = make_window(model="textbook", text="the cat sat")
    w.state.set_text("")
    qtbot.waitUntil(lambda: w.state.result is None, timeout=30000)
    assert not w.export_html("/tmp/never-written.html")
    assert "nothing to export yet" in w.banner.text
