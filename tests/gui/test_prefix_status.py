"""The status bar says what an edit reused of the last run (a decoder's prefix), or for an encoder why nothing
can be; the line goes with the result it describes."""
from __future__ import annotations

import pytest

from attn_explorer.api import prefix
from tests.tiny_llama import make_llama_folder

TEXT = "Attention lets every token look at the tokens before it."


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("llama"), seed=5))


def test_typing_at_the_end_says_how_many_tokens_were_reused(make_window, qtbot, llama_folder):
    prefix.forget()
    w = make_window(model=llama_folder, text=TEXT, view="grid")
    label = w.status_labels["reuse"]
    first = w.state.result
    assert label.text() == f"reused 0 of {first.num_tokens:,} tokens"
    assert label.toolTip() == first.reuse and "nothing kept" in first.reuse
    w.state.set_text(TEXT + " Then it looks again")
    qtbot.waitUntil(lambda: w.state.result is not first, timeout=30000)
    r = w.state.result
    assert r.reuse.startswith("reused ") and not r.reuse.startswith("reused 0 ")
    assert label.text() == r.reuse == f"reused {int(r.reuse.split()[1])} of {r.num_tokens:,} tokens"
    w.state.set_text("")
    qtbot.waitUntil(lambda: label.text() == "" and label.toolTip() == "", timeout=30000)


def test_an_encoder_says_each_edit_recomputes_every_token(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="grid")
    n = w.state.result.num_tokens
    assert w.status_labels["reuse"].text() == f"encoder: each edit recomputes all {n:,} tokens"
    assert "every token sees every other" in w.status_labels["reuse"].toolTip()
