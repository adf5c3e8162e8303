"""Issue 26 B on the Generate page: with a tiny random LLaVA (tests/hub/test_parity_vlm.make) and a picture open,
generation draws each new word's attention to the image tokens on the picture as the word arrives; clicking a
word afterwards draws its step; the page says the weights are random; a new picture or an edited prompt leaves
no stale overlay or caption."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from attn_explorer.gui.widgets.overlay import blend  # noqa: E402
from tests.gui.window.test_vlm_window import PROMPT, _page, _ready, llava  # noqa: E402,F401


def _generate(qtbot, page, n=5):
    ends = []
    page.session.finished.connect(ends.append)
    page.max_tokens.setValue(n)
    page.generate_button.click()
    qtbot.waitUntil(lambda: bool(ends), timeout=60000)
    return ends


def test_each_new_word_is_drawn_on_the_picture_as_it_is_written(qtbot, settings, llava):
    from attn_explorer.api.vlm import image_overlay

    folder, w, st, page = _page(qtbot, settings, llava, "generate")
    assert page.session.can_generate and page.generate_button.isEnabled()
    assert not page.vlm.isHidden() and page.attn_plot.isHidden() and not page.temperature.isEnabled()
    assert "image tokens" in page.empty_hint.text()
    assert page.prompt.text() == PROMPT  # the explorer's prompt, with its <image> placeholder
    assert "random weights" in page.notice.text()  # a folder's weights are never called trained
    drawn = []  # at each step: the step drawn and its picture, taken when the step arrives
    page.session.step_arrived.connect(lambda s: drawn.append((page.vlm.shown, s.index, page.vlm.image.image.copy())))
    from tests.gui.lessons.test_gui_thread import TorchCalls

    with TorchCalls() as calls:  # the steps run in the worker; the GUI thread only places rows on the picture
        ends = _generate(qtbot, page, 5)
    assert not calls.calls, calls.report()
    steps = page.session.steps
    assert ends == ["done"] and len(steps) >= 2 and len(drawn) == len(steps)
    assert [d[0] for d in drawn] == [d[1] for d in drawn] == list(range(len(steps)))  # the newest, as it came
    prompt = page.vlm.prompt
    alpha, cmap = st.alpha, st.colormap
    for shown, _i, rgb in drawn:  # each picture is that step's row, every layer and head averaged
        from attn_explorer.session.vlm_generation import step_overlay

        want = blend(prompt.image, step_overlay(steps[shown], prompt, 0, 0, "all").picture, alpha, cmap)
        assert np.array_equal(rgb, want)
    assert len({d[2].tobytes() for d in drawn}) > 1  # the picture moved with the words
    # step 0's overlay is the prompt's last token's in a run on the picture and the prompt
    r = st.result
    assert np.allclose(step_overlay(steps[0], prompt, 0, 0, "all").picture,
                       image_overlay(r, r.num_tokens - 1).picture, atol=1e-6)
    cap = page.vlm.caption.text()
    assert f"word {len(steps)}" in cap and "16 image tokens" in cap and "random weights" in cap
    # clicking the first word: its overlay, for the selected head when asked
    with TorchCalls() as calls:
        page.vlm.words.anchorClicked.emit(__import__("PySide6.QtCore", fromlist=["QUrl"]).QUrl("0"))
        assert page.vlm.shown == 0 and page.vlm.pinned and "word 1)" in page.vlm.caption.text()
        page.vlm.average.setCurrentIndex(page.vlm.average.findData("head"))
        page.layer.setValue(2)
        page.head.setValue(3)
    assert not calls.calls, calls.report()
    got = page.vlm.overlay
    assert np.allclose(got.picture, step_overlay(steps[0], prompt, 2, 3, "head").picture)
    assert np.allclose(got.picture.ravel(), steps[0].attention[2, 3, r.image_token_positions[:, 0]])
    assert "layer 2, head 3" in page.vlm.plot.titleLabel.text
    # an edited prompt: the caption says the picture was written after the old one
    page.prompt.textEdited.emit("USER: <image>\nwhere is the dog ASSISTANT:")
    assert "edited since" in page.vlm.caption.text()
    # a new picture: what was written goes, and the caption says why (nothing of the old overlay stays)
    from PIL import Image

    other = folder / "other.png"
    Image.fromarray(np.full((40, 52, 3), 200, np.uint8)).save(other)
    st.set_image(str(other))
    assert page.vlm.prompt is None and page.vlm.image.image is None and not page.vlm.words.toPlainText()
    assert "new picture" in page.vlm.caption.text() and "edited" not in page.vlm.caption.text()
    assert page.session.steps == [] and page.output.toPlainText() == ""
    st.shutdown()


def test_a_text_model_afterwards_gets_the_rows_back(qtbot, settings, llava):
    folder, w, st, page = _page(qtbot, settings, llava, "generate")
    _generate(qtbot, page, 2)
    assert page.vlm.prompt is not None
    from tests.tiny_llama import make_llama_folder

    st.load_model(str(make_llama_folder(folder / "llama")), want_image=False)
    _ready(qtbot, st, "text")
    assert page.vlm.isHidden() and not page.attn_plot.isHidden() and page.temperature.isEnabled()
    assert page.vlm.prompt is None and page.vlm.info is None
    _generate(qtbot, page, 2)
    assert page.image.image is not None and page.image.image.shape[0] == page.session.steps[-1].attention.shape[0] * \
        page.session.steps[-1].attention.shape[1]
    st.shutdown()
