"""The Generate page under pytest-qt, with a tiny random Llama folder (not SmolLM2)."""
from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("transformers")

from tests.tiny_llama import make_llama_folder  # noqa: E402


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("llama")))


def _page(window):
    window.show_page("generate")
    return window.pages["generate"]


def test_generation_adds_one_column_per_new_token(make_window, llama_folder, qtbot):
    window = make_window(model=llama_folder, text="The capital of France")
    page = _page(window)
    assert page.session.can_generate and page.generate_button.isEnabled()
    assert not page.load_button.isVisible()
    page.prompt.setText("The capital of")
    page.max_tokens.setValue(6)
    widths, ends = [], []
    page.session.step_arrived.connect(lambda _s: widths.append(page.image.image.shape[1]))
    page.session.finished.connect(ends.append)
    qtbot.mouseClick(page.generate_button, qtbot_button())
    qtbot.waitUntil(lambda: bool(ends), timeout=30000)
    steps = page.session.steps
    n0 = len(page.session.prompt.ids)
    assert ends == ["done"] and 1 <= len(steps) <= 6
    assert widths == list(range(n0, n0 + len(steps)))  # one column more per new token
    assert page.image.image.shape[0] == 2 * 6  # L·H rows
    np.testing.assert_allclose(page.image.image, steps[-1].attention.reshape(12, -1))
    assert page.output.toPlainText() == page.session.text
    assert len(page.sink_curve.getData()[0]) == len(steps)
    np.testing.assert_allclose(page.sink_curve.getData()[1][-1], steps[-1].attention[:, :, 0].mean(), rtol=1e-6)
    assert f"step {len(steps)}" in page.sink_label.text()
    # one wording for temperature 0: the slider and the title both say greedy (no "T = 1" beside a 0)
    assert page.temperature_label.text() == "0 (greedy)"
    assert page.bars_plot.plotItem.titleLabel.text == f"step {len(steps)}: greedy"
    page.temperature.setValue(20)  # moving the slider afterwards does not relabel what was drawn
    page._step(steps[-1])
    assert page.bars_plot.plotItem.titleLabel.text == f"step {len(steps)}: greedy"
    assert page.temperature_label.text() == "1.00"
    assert len(page.bars.opts["width"]) == 10
    np.testing.assert_allclose(page.bars.opts["width"], steps[-1].top_probs[:10])
    # one head's rows: a triangle with one row per step
    page.mode.setCurrentIndex(1)
    page.layer.setValue(1)
    page.head.setValue(4)
    tri = page.image.image
    assert tri.shape == (len(steps), n0 + len(steps) - 1)
    np.testing.assert_allclose(tri[0, :n0], steps[0].attention[1, 4])
    assert not tri[0, n0:].any()


def test_stop_ends_the_stream(make_window, llama_folder, qtbot, monkeypatch):
    window = make_window(model=llama_folder, text="The capital of France")
    page = _page(window)
    module = window.state._model.module
    plain = module.logits

    def no_end(hidden):  # the special tokens (ids 0..2) never win: only Stop ends this generation
        logits = plain(hidden).clone()
        logits[..., :3] = float("-inf")
        return logits

    monkeypatch.setattr(module, "logits", no_end)
    page.chat.setChecked(False)  # the plain prompt: with 100 new tokens it fits the tiny model's 128 positions
    page.max_tokens.setValue(100)
    ends = []
    page.session.finished.connect(ends.append)
    # press Stop as soon as the first step is drawn: steps the worker already made must not arrive
    page.session.step_arrived.connect(lambda _s: page.stop_button.isEnabled() and page.stop_button.click())
    page.generate()
    assert page.stop_button.isEnabled()
    qtbot.waitUntil(lambda: bool(ends), timeout=30000)
    # the stopped job ends at its next step; by then anything it made has arrived (or been dropped)
    qtbot.waitUntil(lambda: not window.state.job_busy("generate"), timeout=30000)
    assert ends == ["stopped"] and len(page.session.steps) == 1
    assert "stopped" in page.status.text() and not page.stop_button.isEnabled()


def test_an_encoder_gets_a_plain_notice(make_window, qtbot):
    window = make_window(model="textbook")
    page = _page(window)
    assert "encoder" in page.notice.text() and "smollm2-135m" in page.notice.text()
    assert page.empty_hint.text() == "Generation needs a decoder: load one above."  # not "Press Generate"
    assert page.load_button.isVisible() and not page.generate_button.isEnabled()
    page.generate()
    assert page.session.steps == [] and not page.session.running


def test_a_new_model_clears_what_was_generated(make_window, llama_folder, qtbot):
    window = make_window(model=llama_folder, text="The capital of France")
    page = _page(window)
    page.max_tokens.setValue(3)
    ends = []
    page.session.finished.connect(ends.append)
    page.generate()
    qtbot.waitUntil(lambda: bool(ends), timeout=30000)
    assert page.output.toPlainText()
    window.state.load_model("textbook")
    qtbot.waitUntil(lambda: window.state.info.name == "textbook", timeout=30000)
    assert page.output.toPlainText() == "" and page.image.image is None and page.session.steps == []
    assert page.status.text() == "Another model (textbook) was loaded: what the old model wrote is cleared."
    assert page.bars_plot.plotItem.titleLabel.text == "next token"  # no step title over empty bars
    assert len(page.sink_curve.getData()[0] if page.sink_curve.getData()[0] is not None else []) == 0
    assert "encoder" in page.notice.text()


def _endless(window, monkeypatch):
    """The special tokens (ids 0..2) never win: the generation runs until it is stopped."""
    module = window.state._model.module
    plain = module.logits

    def no_end(hidden):
        logits = plain(hidden).clone()
        logits[..., :3] = float("-inf")
        return logits

    monkeypatch.setattr(module, "logits", no_end)


def test_a_model_switch_mid_generation_stops_it_and_says_so(make_window, llama_folder, qtbot, monkeypatch):
    window = make_window(model=llama_folder, text="The capital of France")
    page = _page(window)
    _endless(window, monkeypatch)
    page.chat.setChecked(False)  # the plain prompt: with 100 new tokens it fits the tiny model's 128 positions
    page.max_tokens.setValue(100)
    titles = []

    def third_step(_step):  # ask for another model while the generation is mid-way
        if len(page.session.steps) == 3:
            titles.append(page.bars_plot.plotItem.titleLabel.text)
            window.state.load_model("textbook")

    page.session.step_arrived.connect(third_step)
    page.generate()
    qtbot.waitUntil(lambda: bool(titles), timeout=30000)
    assert titles == ["step 3: greedy"]
    qtbot.waitUntil(lambda: window.state.info.name == "textbook", timeout=30000)
    qtbot.waitUntil(lambda: not window.state.job_busy("generate"), timeout=30000)  # the old job ended
    assert not page.session.running and not page.stop_button.isEnabled()
    assert page.session.steps == [] and page.output.toPlainText() == ""
    note = page.status.text()
    assert re.fullmatch(r"Another model \(textbook\) was loaded: the generation stopped after \d+ tokens, and what "
                        r"it wrote is cleared \(it came from the old model\)\.", note), note
    title = page.bars_plot.plotItem.titleLabel.text
    assert "step" not in title and "step" not in page.attn_plot.plotItem.titleLabel.text


def test_before_a_run_the_plots_give_way_to_a_hint(make_window, llama_folder, qtbot):
    window = make_window(model=llama_folder, text="The capital of France")
    page = _page(window)
    qtbot.waitUntil(lambda: page.isVisible())
    for plot in (page.bars_plot, page.attn_plot, page.sink_plot):
        assert not plot.isVisible()  # no −0.5…0.5 axes around nothing
    assert page.empty_hint.isVisible() and "Press Generate" in page.empty_hint.text()
    page.max_tokens.setValue(2)
    with qtbot.waitSignal(page.session.finished, timeout=30000):
        page.generate()
    assert all(p.isVisible() for p in (page.bars_plot, page.attn_plot, page.sink_plot))
    assert not page.empty_hint.isVisible()


def test_the_titles_fit_at_1024x700(make_window, llama_folder, qtbot, monkeypatch):
    window = make_window(model=llama_folder, text="The capital of France")
    window.resize(1024, 700)
    page = _page(window)
    _endless(window, monkeypatch)
    page.temperature.setValue(13)  # T = 0.65: the longest title wording
    page.max_tokens.setValue(12)
    with qtbot.waitSignal(page.session.finished, timeout=30000):
        page.generate()
    qtbot.waitUntil(lambda: page.bars_plot.width() < 400)  # the window's layout settled at 1024 px
    for plot in (page.bars_plot, page.attn_plot, page.sink_plot):
        title = plot.plotItem.titleLabel
        text = title.item.toPlainText()
        drawn = title.item.mapRectToScene(title.item.boundingRect())  # scene = the plot widget's pixels
        assert text and drawn.left() >= 0 and drawn.right() <= plot.width(), (text, drawn, plot.width())


def qtbot_button():
    from PySide6.QtCore import Qt

    return Qt.MouseButton.LeftButton


# ---- an instruct model: chat is ticked when the tokenizer has a chat template, and an answer that is only
# an end token says why instead of leaving `<|im_end|>` alone on the page

def test_chat_is_ticked_for_a_model_with_a_chat_template(make_window, llama_folder, qtbot):
    window = make_window(model=llama_folder, text="The capital of France")
    page = _page(window)
    qtbot.waitUntil(lambda: page.session.has_chat is not None, timeout=30000)
    assert page.session.has_chat is True
    assert page.chat.isChecked() and page.chat.isEnabled()


def test_an_answer_that_ends_at_once_says_why(make_window, llama_folder, qtbot, monkeypatch):
    window = make_window(model=llama_folder, text="The capital of France")
    page = _page(window)
    qtbot.waitUntil(lambda: page.session.has_chat is not None, timeout=30000)
    module = window.state._model.module
    plain = module.logits
    end = sorted(window.state._model.tokenizer.tok.get_vocab().items(), key=lambda kv: kv[1])[:3]

    def ends(hidden):  # an end token wins at once, as SmolLM2-Instruct's <|im_end|> does without its template
        logits = plain(hidden).clone()
        logits[..., 2] = 1e4
        return logits

    monkeypatch.setattr(module, "logits", ends)
    page.chat.setChecked(False)
    page.max_tokens.setValue(8)
    with qtbot.waitSignal(page.session.finished, timeout=30000):
        page.generate()
    assert len(page.session.steps) == 1 and page.session.steps[0].last, end
    status = page.status.text()
    assert "ended at once" in status and "tick Chat" in status, status
    page.chat.setChecked(True)  # with chat ticked the hint about Chat would be false: it is not given
    with qtbot.waitSignal(page.session.finished, timeout=30000):
        page.generate()
    status = page.status.text()
    assert "ended at once" in status and "tick Chat" not in status, status
