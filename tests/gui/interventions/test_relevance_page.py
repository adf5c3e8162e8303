"""The relevance page: an image's patches under the heat of its class, a text's tokens as bars, progress to
100 %, a cancelled explanation that never lands, and a target box that says what it takes."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.session.relevance import LANE

pytest.importorskip("pytestqt")


@pytest.fixture
def digit(tmp_path):
    """A held-out digit of the trainer's split (seed 0), as a PNG, and its label."""
    from PIL import Image

    from attn_explorer.lessons.digits import load_digits

    d = load_digits(0)
    path = tmp_path / "digit.png"
    Image.fromarray((d.x_test[0].transpose(1, 2, 0) * 255).astype(np.uint8)).resize((64, 64)).save(path)
    return str(path), int(d.y_test[0])


def test_image_relevance_overlay_reaches_100_percent_and_follows_the_method(make_window, qtbot, digit):
    path, label = digit
    w = make_window(model="tiny-vit-digits", image=path, view="relevance")
    page = w.pages["relevance"]
    qtbot.waitUntil(lambda: page.data is not None, timeout=30000)
    d = page.data
    assert page.progress.fraction == 1.0 and "backward" in page.progress.label.text()
    assert d.grid == (4, 4) and d.scores.shape == (17,) and page.picture.isVisible() and not page.bars_plot.isVisible()
    assert f'logit of class "{label}"' in page.caption.text()  # the trained model gets this digit right
    assert page.picture_img.image.shape[:2] == w.state.result.image.shape[:2]
    page.method.setCurrentIndex(page.method.findData("attnlrp"))
    qtbot.waitUntil(lambda: page.data is not None and page.data.method == "attnlrp", timeout=30000)
    assert "uniform rule" in page.caption.text() and "not drawn" in page.caption.text()
    page.target.setText("3")
    page.target.returnPressed.emit()
    qtbot.waitUntil(lambda: page.data is not None and page.data.target == 'logit of class "3"', timeout=30000)


def test_cancel_stops_the_explanation_and_nothing_of_it_lands(make_window, qtbot, digit):
    w = make_window(model="tiny-vit-digits", image=digit[0], view="relevance")
    page = w.pages["relevance"]
    qtbot.waitUntil(lambda: page.data is not None, timeout=30000)
    page.method.setCurrentIndex(page.method.findData("attnlrp"))  # starts a new explanation
    assert page.data is None and page.progress.button.isVisible()
    page.cancel()
    assert "cancelled" in page.progress.label.text() and not page.progress.button.isVisible()
    qtbot.waitUntil(lambda: not w.state.job_busy(LANE), timeout=30000)  # the cancelled job is over
    qtbot.wait(0)  # queued handlers of the finished job run now
    assert page.data is None and "cancelled" in page.progress.label.text()
    page.explain_button.click()
    qtbot.waitUntil(lambda: page.data is not None, timeout=30000)
    assert page.data.method == "attnlrp" and page.progress.fraction == 1.0


def test_text_encoder_needs_a_reference_then_draws_one_bar_per_token(make_window, qtbot):
    w = make_window(model="minilm", text="The animal didn't cross the street because it was too tired.",
                    view="relevance")
    page = w.pages["relevance"]
    qtbot.waitUntil(lambda: "reference sentence" in page.stack.placeholder.text(), timeout=30000)
    assert page.data is None and not w.state.job_busy(LANE)  # nothing to explain yet: no job started
    assert "reference sentence" in page.target.placeholderText()
    page.target.setText("A tired dog stayed on the pavement.")
    page.target.returnPressed.emit()
    qtbot.waitUntil(lambda: page.data is not None, timeout=60000)
    d = page.data
    assert len(d.scores) == w.state.result.num_tokens == len(page.bars.opts["height"])
    assert page.bars_plot.isVisible() and "cosine similarity" in page.caption.text()
    assert page.token_axis._labels == list(d.tokens)


def test_unused_drawing_options_are_named_and_the_note_goes_with_them(make_window, qtbot, digit):
    """Relevance is drawn as measured: "Hide specials" and "Scale: log" are said to be unused while on."""
    w = make_window(model="tiny-vit-digits", image=digit[0], view="relevance")
    page = w.pages["relevance"]
    qtbot.waitUntil(lambda: page.data is not None, timeout=30000)
    assert "not used here" not in page.note.text() and page.note.isHidden()
    w.state.set_options(hide_special=True)
    qtbot.waitUntil(lambda: "Hide specials: not used here" in page.note.text(), timeout=30000)
    w.state.set_options(hide_special=False)
    qtbot.waitUntil(lambda: page.data is not None and page.note.isHidden(), timeout=30000)


def test_no_torch_on_the_gui_thread_while_relevance_arrives_and_is_redrawn(make_window, qtbot, digit):
    from tests.gui.lessons.test_gui_thread import TorchCalls

    w = make_window(model="tiny-vit-digits", image=digit[0], view="relevance")
    page = w.pages["relevance"]
    qtbot.waitUntil(lambda: page.data is not None, timeout=30000)
    recorder = TorchCalls()
    with recorder:
        page.method.setCurrentIndex(page.method.findData("attnlrp"))
        qtbot.waitUntil(lambda: page.data is not None and page.data.method == "attnlrp", timeout=30000)
        w.state.set_options(colormap="magma")  # a redraw of what arrived
    assert not recorder.calls, recorder.report()
