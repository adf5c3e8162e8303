"""The lesson pages' shared fixtures: one lesson page on its own state, and `settle` to wait for its jobs.

A test module names its lesson (`LESSON = "by-hand"`) and may give the page's size (`SIZE = (w, h)`);
`page` is that lesson's page, shown, with its first numbers on screen. Every lesson computes in
workers (`state.submit` lanes named in `page.lanes`): after an edit, `settle(page)` waits until every
lane of the page is idle, so its answers have been drawn.
"""
from __future__ import annotations

import pytest

from attn_explorer.session.state import SessionState


def lanes_idle(page) -> bool:
    return not any(page.state.job_busy(key) for key in page.lanes)


@pytest.fixture
def settle(qtbot):
    def wait(page, timeout: int = 60000):
        qtbot.waitUntil(lambda: lanes_idle(page), timeout=timeout)
        return page

    return wait


def stop_page(page, qtbot) -> None:
    """Stop whatever the page still runs (a paused training run waits in its worker), with no answer to
    come (pytest-qt may have closed the page already), and wait for its lanes to empty."""
    if hasattr(page, "shutdown"):
        page.shutdown()
    for key in page.lanes:
        page.state.cancel(key)
    qtbot.waitUntil(lambda: lanes_idle(page), timeout=30000)


@pytest.fixture
def page(request, qtbot, settle):
    from attn_explorer.gui.lessons import page_class

    state = SessionState(device="cpu")
    p = page_class(request.module.LESSON)(state)
    qtbot.addWidget(p)
    p.resize(*getattr(request.module, "SIZE", (1000, 800)))
    p.show()
    settle(p)
    yield p
    stop_page(p, qtbot)
    state.shutdown()
