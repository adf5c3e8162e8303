"""The Generate page and an instruct model: chat is ticked when the tokenizer has a chat template, and an
answer that is only an end token says why instead of leaving `<|im_end|>` alone on the page."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests.tiny_llama import make_llama_folder  # noqa: E402


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("llama")))


def _page(window):
    window.show_page("generate")
    return window.pages["generate"]


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
