"""The Lab page's needle fields and its results files: the needle, question and expected answer are fields
with the defaults in them, checked before a run (a bad one is one banner line and the last result stays) and
passed to the run; "Save results…" writes one .npz and "Open results…" shows it again without the model; a
bad file is one banner line and what was shown stays."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.session.lab import KEY_FACT, NEEDLE, QUESTION, Needle
from tests.analysis.atlas_planted import INDUCTION_HEAD, make_planted_folder
from tests.gui.analysis.lab_helpers import lab, retrieval


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return str(make_planted_folder(tmp_path_factory.mktemp("planted")))


def test_the_needle_fields_hold_the_defaults_are_checked_and_are_used(make_window, qtbot, planted):
    w, page, banners = lab(make_window, planted, needle=None)
    page.set_mode("retrieval")
    assert page.needle_edit.isVisible() and page.question_edit.isVisible() and page.answer_edit.isVisible()
    assert page.needle_edit.text() == NEEDLE and page.answer_edit.text() == KEY_FACT
    assert "\n" not in page.question_edit.text() and "\\n" in page.question_edit.text()  # a line break as \n
    assert page.needle == Needle(NEEDLE, QUESTION, KEY_FACT)
    page.set_mode("induction")
    assert not page.needle_edit.isVisible()
    page.needle = Needle("alpha bravo charlie delta", "alpha bravo", "charlie delta")
    first = retrieval(qtbot, page, check=False)
    for field, text, word in ((page.answer_edit, "zulu", "not in the needle"), (page.needle_edit, "  ", "needle"),
                              (page.answer_edit, "", "answer"), (page.question_edit, "", "question")):
        before = field.text()
        field.setText(text)
        page.run()
        assert not page.progress.running and page.retrieval is first  # the last result stays, drawn
        assert page.view.accuracy is not None and page.ranking.count() > 0
        field.setText(before)
    assert len(banners) == 4 and all("\n" not in b for b in banners)
    assert "not in the needle" in banners[0] and "needle" in banners[1] and "answer" in banners[2]
    page.needle_edit.setText("echo foxtrot golf hotel")
    page.question_edit.setText("echo foxtrot")
    page.answer_edit.setText("golf hotel")
    page.run()
    qtbot.waitUntil(lambda: page.retrieval is not None, timeout=60000)
    run = page.retrieval
    assert run.needle == Needle("echo foxtrot golf hotel", "echo foxtrot", "golf hotel")
    assert all(text.strip().startswith("golf hotel") and ok for *_, text, ok in run.result.answers)
    assert len(banners) == 4


def test_save_and_open_results_without_the_model(make_window, qtbot, planted, tmp_path):
    from attn_explorer.analysis.lab_results import load_results

    w, page, banners = lab(make_window, planted)
    assert not page.save_button.isEnabled() and page.open_button.isEnabled()
    r = retrieval(qtbot, page)
    assert page.save_button.isEnabled()
    path = tmp_path / "lab.npz"
    page.save(str(path))
    qtbot.waitUntil(lambda: "Saved" in page.readout.text(), timeout=30000)
    got = load_results(path)
    assert got.kind == "retrieval" and got.check.to_dict() == page.retrieval_check.to_dict()
    np.testing.assert_array_equal(got.result.actual, r.result.actual)
    assert got.settings["needle"] == "alpha bravo charlie delta" and got.settings["answer"] == "charlie delta"
    # the induction view saves its own result
    page.set_mode("induction")
    page.run()
    qtbot.waitUntil(lambda: page.induction is not None, timeout=60000)
    page.save(str(tmp_path / "ind"))  # the suffix is added
    qtbot.waitUntil(lambda: (tmp_path / "ind.npz").exists(), timeout=30000)
    assert load_results(tmp_path / "ind.npz").kind == "induction"
    # open in a window whose model is another one: shown without its model, and said so
    w2 = make_window(view="lab")
    other = w2.pages["lab"]
    lines = []
    w2.state.error_raised.connect(lines.append)
    other.open(str(path))
    qtbot.waitUntil(lambda: other.retrieval is not None, timeout=30000)
    assert other.current_mode() == "retrieval" and other.retrieval.result.model == r.result.model
    assert "opened from lab.npz" in other.caption.text() and r.result.model in other.caption.text()
    assert other.ranking.item(0).text().split()[:2] == ["L1", "H0"] and other.view.bar_plot is not None
    assert "matters more" in other.verdict.text() and other.needle_edit.text() == "alpha bravo charlie delta"
    other.check()
    assert lines and "load " in lines[-1] and not other.progress.running
    # a bad file: one banner line, what was shown stays
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    shown = other.retrieval
    other.open(str(junk))
    qtbot.waitUntil(lambda: len(lines) == 2, timeout=30000)
    assert "not a readable .npz" in lines[-1] and "\n" not in lines[-1] and other.retrieval is shown
    other.open(str(tmp_path / "ind.npz"))
    qtbot.waitUntil(lambda: other.induction is not None, timeout=30000)
    assert other.current_mode() == "induction" and other._ranked[0][:2] == INDUCTION_HEAD
    # opened in the window of its own model, the check runs again (its haystacks are built again)
    page.open(str(path))
    qtbot.waitUntil(lambda: page.retrieval is not None and not page.retrieval.cases, timeout=30000)
    page.check()
    qtbot.waitUntil(lambda: page.retrieval_check is not None, timeout=60000)
    assert page.retrieval_check.top == 0.0 and page.retrieval_check.top_heads == [INDUCTION_HEAD]
    assert not banners
