"""What the Lab page's tests share: the planted tiny GPT-2's folder, the page with its banner lines caught, and a
retrieval run (with its check) that waits for its answer."""
from __future__ import annotations

from attn_explorer.session.lab import Needle

PLANTED_NEEDLE = Needle("alpha bravo charlie delta", "alpha bravo", "charlie delta")


def lab(make_window, planted, needle: Needle | None = PLANTED_NEEDLE):
    w = make_window(model=planted, view="lab")
    page = w.pages["lab"]
    if needle is not None:
        page.needle = needle
    banners = []
    w.state.error_raised.connect(banners.append)
    return w, page, banners


def retrieval(qtbot, page, lengths="24,48", depths="0,0.5,1", check=True):
    page.set_mode("retrieval")
    page.lengths.setText(lengths)
    page.depths.setText(depths)
    page.run()
    qtbot.waitUntil(lambda: page.retrieval is not None, timeout=60000)
    if check:
        page.top.setValue(1)
        page.check()
        qtbot.waitUntil(lambda: page.retrieval_check is not None, timeout=60000)
    return page.retrieval
