"""The *Your analyses* page: ax.register_analysis(name, fn) drawn as a layer × head grid or a token strip from
the answer's shape, run in a worker (never the GUI thread), and a failing fn is a banner line while the last
good view stays. With nothing registered, the page says how to register one."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from PySide6.QtCore import Qt

import attn_explorer as ax
from attn_explorer.session.custom import HOW_TO_REGISTER
from tests.analysis_registry import prev_token, registry_kept

TEXT = "the cat sat on the mat because it was tired"


@pytest.fixture(autouse=True)
def clean_registry():
    with registry_kept(empty=True):
        yield


def choose(page, name: str) -> None:
    i = page.chooser.findData(name)
    assert i >= 0, [page.chooser.itemData(k) for k in range(page.chooser.count())]
    page.chooser.setCurrentIndex(i)


def test_grid_then_strip_run_off_the_gui_thread(make_window, qtbot):
    threads = []

    def grid(r):
        threads.append(threading.current_thread())
        return prev_token(r)

    def strip(r):
        threads.append(threading.current_thread())
        return r.attentions[:, :, :, 0].mean((0, 1, 2)) + np.arange(len(r.tokens))  # (N,)

    ax.register_analysis("prev_token", grid)
    ax.register_analysis("per_token", strip)
    w = make_window(model="textbook", text=TEXT)
    w.show_page("custom")
    page = w.pages["custom"]
    qtbot.waitUntil(lambda: page.answer is not None, timeout=30000)
    r = w.state.result
    L, H = r.attentions.shape[:2]
    assert page.kind == "grid" and page.answer.name == "prev_token"
    assert page.stack.currentWidget() is page.canvas
    np.testing.assert_allclose(page.image.image, prev_token(r), rtol=1e-6)
    assert page.image.image.shape == (L, H)
    assert "view: grid" in page.view_label.text() and "prev_token" in page.caption.text()
    # hovering a cell reads its value; clicking opens that head
    page._hovered(page.cell_center(1, 2))
    assert page.readout.text().startswith("L1 H2: prev_token = ")
    choose(page, "per_token")
    qtbot.waitUntil(lambda: page.answer is not None and page.answer.name == "per_token", timeout=30000)
    assert page.kind == "panel" and page.answer.view == "tokens"
    assert page.panel.matrix.shape == (1, len(r.tokens))
    assert page.panel.bottom_axis._labels[: len(r.tokens)] == [str(t) for t in r.tokens] or \
        page.panel.tokens[1] == [str(t) for t in r.tokens]
    assert threads and all(t is not threading.main_thread() for t in threads), threads


def test_a_failing_fn_is_a_banner_and_the_last_good_view_stays(make_window, qtbot):
    ax.register_analysis("prev_token", prev_token)
    ax.register_analysis("boom", lambda r: 1 / 0)
    ax.register_analysis("wrong_shape", lambda r: np.zeros(3))
    w = make_window(model="textbook", text=TEXT)
    w.show_page("custom")
    page = w.pages["custom"]
    qtbot.waitUntil(lambda: page.answer is not None, timeout=30000)
    good = page.image.image.copy()
    for name, words in (("boom", "analysis 'boom' failed: ZeroDivisionError"),
                        ("wrong_shape", "analysis 'wrong_shape' returned shape (3,)")):
        w.banner.hide()
        choose(page, name)
        qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=30000)
        assert words in w.banner.text and "\n" not in w.banner.text
        assert page.answer.name == "prev_token" and page.stack.currentWidget() is page.canvas
        np.testing.assert_array_equal(page.image.image, good)
        assert "last answer that worked" in page.caption.text()


def test_with_nothing_registered_the_page_says_how(make_window, qtbot):
    w = make_window(model="textbook", text=TEXT)
    w.show_page("custom")
    page = w.pages["custom"]
    qtbot.waitUntil(lambda: page.stack.placeholder.text() == HOW_TO_REGISTER, timeout=30000)
    assert page.stack.currentWidget() is page.stack.placeholder
    assert "ax.register_analysis(" in HOW_TO_REGISTER and page.chooser.count() == 0
    # registering one while the window is open: coming back to the page draws it
    ax.register_analysis("prev_token", prev_token)
    w.show_page("overview")
    w.show_page("custom")
    qtbot.waitUntil(lambda: page.answer is not None, timeout=30000)
    assert page.chooser.count() == 1 and page.kind == "grid"
    # and Run again reads the registry again: a second one joins the chooser
    ax.register_analysis("per_token", lambda r: np.ones(len(r.tokens)))
    qtbot.mouseClick(page.again, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.chooser.count() == 2, timeout=30000)
