"""The inside-a-head lesson's error line: it goes when the head changes or a trace succeeds, and the header
points to where the line really is."""
from __future__ import annotations

from tests.gui.lessons.test_inside_a_head import open_page


def test_a_failed_trace_line_clears_with_the_next_head_and_is_pointed_to_where_it_is(make_window, qtbot):
    window = make_window(model="textbook", text="the cat sat on the mat")
    page = open_page(window, qtbot)
    state = window.state
    page._failed("empty.png is not an image file (0 bytes)")
    assert page.message.isVisible()
    header = page.header.text()
    y = lambda w: w.mapTo(page, w.rect().topLeft()).y()  # noqa: E731
    assert ("below" in header) if y(page.message) > y(page.header) else ("above" in header), header
    state.select(head=(state.head + 1) % state.info.num_heads)  # another head: the error was about the old one
    assert page.message.text() == "" and not page.message.isVisible()
    qtbot.waitUntil(lambda: page.trace.head == state.head and page.body.isEnabled(), timeout=30000)
    assert page.message.text() == ""
