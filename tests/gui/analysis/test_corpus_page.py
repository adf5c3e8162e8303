"""The Corpus page as a user meets it: gather with progress, cancel, the picture, and a click that opens a sentence."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt

WORDS = "the animal did not cross the street because it was too tired and the cat sat on a mat".split()


def corpus_text(n: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return "\n".join(" ".join(rng.choice(WORDS, size=int(rng.integers(4, 10)))) for _ in range(n))


def test_gathering_fills_the_picture_and_progress_reaches_the_end(make_window, qtbot, tmp_path):
    w = make_window(model="minilm", view="corpus")
    page = w.pages["corpus"]
    f = tmp_path / "s.txt"
    f.write_text(corpus_text(25) + "\n\n", encoding="utf-8")
    assert page.load_file(str(f)) and len(page.sentences) == 25
    assert "25 sentences from s.txt" in page.caption.text()
    page.heads_edit.setText("5:0, 2:1")
    seen = []
    page.progress.bar.valueChanged.connect(seen.append)
    qtbot.mouseClick(page.gather_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.embedding is not None, timeout=60000)
    assert page.progress.bar.maximum() == 25 and seen[-1] == 25 and not page.progress.isVisible()
    assert page.head_choice.count() == 2 and page.shown_head() == (5, 0)
    P = len(page.corpus.points(5, 0).q)
    xq, _ = page.queries.getData()
    xk, _ = page.keys.getData()
    assert len(xq) == len(xk) == P > 0
    assert "entropy" in page.stats_label.text() and page.top_list.count() > 0
    assert "aligned" in page.readout.text() or "mean" in page.readout.text()
    # the other head: a new picture, not the old one relabelled
    old = page.embedding
    page.head_choice.setCurrentIndex(1)
    qtbot.waitUntil(lambda: page.embedding is not None and page.embedding is not old, timeout=30000)
    assert page.shown_head() == (2, 1) and "L2 H1" in page.plot.titleLabel.text


def test_a_point_opens_its_sentence_with_that_token_as_the_query(make_window, qtbot):
    w = make_window(model="minilm", view="corpus")
    page = w.pages["corpus"]
    assert page.set_sentences(corpus_text(6, seed=3), "test")
    page.heads_edit.setText("4:3")
    page.gather()
    qtbot.waitUntil(lambda: page.embedding is not None, timeout=60000)
    pts = page.corpus.points(4, 3)
    i = int(np.flatnonzero(pts.position == 2)[0])
    spot = page.queries.points()[i]
    page._point_clicked([spot], 0)
    sentence = page.corpus.sentences[pts.sentence[i]]
    qtbot.waitUntil(lambda: w.current_page_name == "head", timeout=30000)
    assert w.state.text == sentence and w.state.query == 2 and (w.state.layer, w.state.head) == (4, 3)


def test_cancel_stops_the_gathering_and_keeps_nothing(make_window, qtbot):
    w = make_window(model="minilm", view="corpus")
    page = w.pages["corpus"]
    page.set_sentences(corpus_text(400), "test")
    page.gather()
    qtbot.waitUntil(lambda: page.progress.bar.value() >= 2, timeout=30000)
    qtbot.mouseClick(page.progress.button, Qt.LeftButton)
    assert page.gather_button.isEnabled() and not page.progress.button.isVisible()
    qtbot.waitUntil(lambda: not w.state.job_busy("corpus-gather"), timeout=30000)
    assert page.corpus is None and "Cancelled" in page.stack.placeholder.text()


def test_bad_input_is_one_banner_line_and_changes_nothing(make_window, qtbot, tmp_path):
    w = make_window(model="minilm", view="corpus")
    page = w.pages["corpus"]
    page.set_sentences("a b c\nd e f", "test")
    lines = []
    w.state.error_raised.connect(lines.append)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n", encoding="utf-8")
    assert not page.load_file(str(empty))
    assert not page.load_file(str(tmp_path / "missing.txt"))
    assert page.sentences == ["a b c", "d e f"]  # the last good corpus stays
    page.heads_edit.setText("9:0")
    page.gather()
    assert len(lines) == 3 and "empty" in lines[0] and "not found" in lines[1] and "no head L9 H0" in lines[2]
    assert not w.state.job_busy("corpus-gather")


def test_a_model_switch_drops_what_was_gathered(make_window, qtbot):
    w = make_window(model="minilm", view="corpus")
    page = w.pages["corpus"]
    page.set_sentences(corpus_text(4), "test")
    page.gather()
    qtbot.waitUntil(lambda: page.embedding is not None, timeout=60000)
    w.state.load_model("textbook")
    qtbot.waitUntil(lambda: w.state.info is not None and w.state.info.name == "textbook", timeout=60000)
    assert page.corpus is None and page.head_choice.count() == 0 and page.top_list.count() == 0
    assert "gather again" in page.stack.placeholder.text()
    assert len(page.queries.getData()[0]) == 0
