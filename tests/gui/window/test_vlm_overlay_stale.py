"""Issue 26 B/C: nothing stale on the Overlay page of a vision-language run. A new picture or prompt takes the old
token's overlay and caption off at once; a prompt that fails brings the old run back, said to be the old run
(before: the old caption stayed as if it described the text box's prompt); the same prompt again does not leave
the page waiting. Tiny random LLaVA (tests/hub/test_parity_vlm.make)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from tests.gui.window.test_vlm_window import PROMPT, _ready, _window, llava  # noqa: E402,F401


def _drawn(qtbot, page):
    qtbot.waitUntil(lambda: page._vlm is not None and page.big_rgb is not None and not page.state.busy, timeout=30000)


def test_a_new_picture_or_prompt_leaves_no_stale_overlay(qtbot, settings, llava):
    folder, img = llava
    w, st = _window(qtbot, settings, model=str(folder), image=str(img), text=PROMPT)
    _ready(qtbot, st, "image-text")
    page = w.overlay
    _drawn(qtbot, page)
    first = page.caption.text()
    assert first.startswith("Token <b>")
    # a prompt that cannot run (two placeholders for one picture): the old caption goes at once...
    errors = []
    st.error_raised.connect(errors.append)
    st.set_text("USER: <image><image> two ASSISTANT:")
    assert "prompt changed" in page.caption.text() and page.big_rgb is None
    # ...and the old run comes back, said to be the run before the change, with the reason
    qtbot.waitUntil(lambda: bool(errors) and page.big_rgb is not None, timeout=30000)
    cap = page.caption.text()
    assert cap.startswith("<b>The run before the change</b>") and "placeholders" in cap and first in cap
    page.average.setCurrentIndex(page.average.findData("all"))  # redrawn for other heads: still said
    qtbot.waitUntil(lambda: page._vlm is not None and page._vlm.average == "all", timeout=30000)
    assert page.caption.text().startswith("<b>The run before the change</b>")
    # a prompt that runs: its own caption, nothing of the failure
    st.set_text("USER: <image>\nwhere is the dog ASSISTANT:")
    assert "prompt changed" in page.caption.text()
    qtbot.waitUntil(lambda: "".join(st.result.tokens).count("dog") == 1, timeout=30000)
    _drawn(qtbot, page)
    assert page.caption.text().startswith("Token <b>") and "before the change" not in page.caption.text()
    # a new picture: the old heat goes at once, the new picture's comes
    from PIL import Image

    other = folder / "grey.png"
    Image.fromarray(np.full((40, 52, 3), 90, np.uint8)).save(other)
    old = page._vlm.picture.copy()
    st.set_image(str(other))
    assert "picture changed" in page.caption.text() and page.big_rgb is None
    _drawn(qtbot, page)
    assert page.caption.text().startswith("Token <b>") and not np.allclose(page._vlm.picture, old)
    # the same prompt again: no new run, and the page does not stay waiting
    st.set_text(st.text)
    qtbot.waitUntil(lambda: page.big_rgb is not None, timeout=30000)
    assert page.caption.text().startswith("Token <b>")
    st.shutdown()
