"""Lesson page "coreference": pickers from the tokens, the ranking from a worker, the jump to the best head."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from attn_explorer.lessons import coreference as co


@pytest.fixture
def setup(make_window, qtbot):
    window = make_window(model="minilm", text=co.PRIMER_SENTENCE)
    page = window.pages["lessons"].show_lesson("coreference")
    qtbot.waitUntil(lambda: page.find_btn.isEnabled(), timeout=30000)
    return window, page


def test_pickers_default_to_the_primer_words(setup):
    _, page = setup
    assert page.query.currentText().startswith("it ")
    assert page.target.currentText().startswith("animal ")
    assert page.rival.currentText().startswith("street ")
    assert all(page.query.itemText(i) not in ("[CLS]", "[SEP]") for i in range(page.query.count()))


def test_find_ranks_every_head_and_jumps_to_the_best(setup, qtbot):
    window, page = setup
    state = window.state
    qtbot.mouseClick(page.find_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.ranking is not None, timeout=60000)
    q, a, b = page.picked()
    want = co.rank_heads(state.result.attentions, q, a, b)
    assert [(h.layer, h.head) for h in page.ranking.heads] == [(h.layer, h.head) for h in want]
    rows = page.cell_texts()
    assert len(rows) == state.info.num_layers * state.info.num_heads
    best = want[0]
    assert rows[0][:4] == ["1", str(best.layer), str(best.head), f"{best.score:+.3f}"]
    assert (state.layer, state.head) == (best.layer, best.head)
    assert state.query == q[0] and state.result.tokens[state.query] == "it"
    assert f"layer {best.layer}, head {best.head}" in page.status.text()
    # another row, double-clicked, selects that head
    page.table.cellDoubleClicked.emit(2, 0)
    assert (state.layer, state.head) == (want[2].layer, want[2].head)
    qtbot.mouseClick(page.open_btn, Qt.LeftButton)
    assert window.tabs.currentWidget() is window._tab_of["head"]


def test_changing_a_pick_or_the_text_clears_the_ranking(setup, qtbot):
    window, page = setup
    qtbot.mouseClick(page.find_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.ranking is not None, timeout=60000)
    page.rival.setCurrentIndex(page.rival.findText("the", Qt.MatchStartsWith))
    assert page.ranking is None and page.table.rowCount() == 0 and page.status.text() == ""
    qtbot.mouseClick(page.find_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.ranking is not None, timeout=60000)
    window.state.set_text("The trophy didn't fit in the suitcase because it was too big.")
    qtbot.waitUntil(lambda: "trophy" in window.state.result.tokens, timeout=30000)
    assert page.ranking is None and page.table.rowCount() == 0
    assert page.query.currentText().startswith("it ")
    assert page.target.findText("trophy", Qt.MatchStartsWith) >= 0


def test_a_word_in_pieces_is_one_choice(make_window, qtbot):
    window = make_window(model="minilm", text="The unbelievably tired animal slept because it was exhausted.")
    page = window.pages["lessons"].show_lesson("coreference")
    qtbot.waitUntil(lambda: page.find_btn.isEnabled(), timeout=30000)
    tokens = window.state.result.tokens
    pieces = [w for w in page.words if len(w.indices) > 1]
    assert pieces, tokens  # WordPiece cut at least one word
    w = pieces[0]
    assert page.target.findText(w.text + "  (tokens", Qt.MatchStartsWith) >= 0
    page.target.setCurrentIndex(page.target.findData(page.words.index(w)))
    q, a, b = page.picked()
    assert a == w.indices
    qtbot.mouseClick(page.find_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.ranking is not None, timeout=60000)
    to_a, _ = co.head_scores(window.state.result.attentions, q, a, b)
    assert page.ranking.best.to_a == pytest.approx(float(to_a.flat[np.argmax(
        (to_a - co.head_scores(window.state.result.attentions, q, a, b)[1]).ravel())]), rel=1e-6)


def test_the_primer_button_puts_its_sentence_in_the_text_box_and_it_stays(make_window, qtbot):
    """The button sets the session's text through state.set_text; the Text box shows it, and the next
    keystroke edits it (it used to bring the old text back, and the primer's sentence was lost)."""
    window = make_window(model="minilm", text="A cat sat on the mat.")
    page = window.pages["lessons"].show_lesson("coreference")
    box = window.input_panel.text
    qtbot.mouseClick(page.primer_btn, Qt.LeftButton)
    assert box.toPlainText() == co.PRIMER_SENTENCE == window.state.text
    qtbot.waitUntil(lambda: "animal" in window.state.result.tokens, timeout=30000)
    box.moveCursor(QTextCursor.End)
    qtbot.keyClicks(box, " Yes")
    qtbot.waitUntil(lambda: window.state.text == co.PRIMER_SENTENCE + " Yes", timeout=10000)
    qtbot.waitUntil(lambda: "yes" in [t.lower() for t in window.state.result.tokens], timeout=30000)
    assert box.toPlainText() == co.PRIMER_SENTENCE + " Yes"
    assert page.query.currentText().startswith("it ") and page.target.currentText().startswith("animal ")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from tests.tiny_llama import make_llama_folder

    return str(make_llama_folder(tmp_path_factory.mktemp("llama")))


def test_a_decoder_gets_the_primer_words_and_an_honest_ranking(make_window, qtbot, tiny_llama):
    """A Llama's tokens carry a leading space (" it"): the pickers still find it / animal / street, and
    the ranking compares only what "it" can see (a causal model hides the tokens after it)."""
    window = make_window(model=tiny_llama, text=co.PRIMER_SENTENCE)
    page = window.pages["lessons"].show_lesson("coreference")
    qtbot.waitUntil(lambda: page.find_btn.isEnabled(), timeout=30000)
    assert window.state.info.causal
    assert [b.currentText().split()[0] for b in (page.query, page.target, page.rival)] == ["it", "animal", "street"]
    qtbot.mouseClick(page.find_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.ranking is not None, timeout=60000)
    q, a, b = page.picked()
    want = co.rank_heads(window.state.result.attentions, q, a, b, causal=True)
    assert [(h.layer, h.head) for h in page.ranking.heads] == [(h.layer, h.head) for h in want]
    assert any(abs(h.score) > 1e-3 for h in page.ranking.heads) and "comes after" not in page.status.text()
    # a rival after the query: no head can look at it, and the page says what it ranks by instead
    page.rival.setCurrentIndex(page.rival.findText("tired", Qt.MatchStartsWith))
    qtbot.mouseClick(page.find_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.ranking is not None, timeout=60000)
    assert page.ranking.hidden == {"b"} and all(h.to_b == 0.0 for h in page.ranking.heads)
    assert "comes after" in page.status.text() and "alone" in page.status.text()
    # a target after the query as well: one line, no table of zeros
    page.target.setCurrentIndex(page.target.findText("was", Qt.MatchStartsWith))
    qtbot.mouseClick(page.find_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.message.text() != "", timeout=60000)
    assert page.ranking is None and page.table.rowCount() == 0 and "before the query" in page.message.text()
