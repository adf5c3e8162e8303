"""The Lab page as a user meets it, on the planted tiny GPT-2 (layer 1 head 0 an induction head that copies,
64 positions): the induction run lists the planted head first and its check says so; the retrieval run's
accuracy grid has the asked shape and ranks the copying head first; Cancel (button and Esc) keeps nothing;
a bad lengths field is one banner line; a click on a head selects it in the window; a model switch clears."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.analysis.atlas_planted import INDUCTION_HEAD, make_planted_folder
from tests.gui.analysis.lab_helpers import lab


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return str(make_planted_folder(tmp_path_factory.mktemp("planted")))


def click_scene(qtbot, canvas, scene_pos):
    qtbot.mouseClick(canvas.viewport(), Qt.LeftButton, pos=canvas.mapFromScene(scene_pos))


def test_induction_run_lists_the_planted_head_first_and_checks_it(make_window, qtbot, planted):
    w, page, banners = lab(make_window, planted)
    assert page.lengths.text() == "28,56"  # 512,1024 do not fit 64 positions
    seen = []
    page.progress.bar.valueChanged.connect(seen.append)
    qtbot.mouseClick(page.run_button, Qt.LeftButton)
    assert page.progress.isVisible() and not page.run_button.isEnabled()
    qtbot.waitUntil(lambda: page.induction is not None, timeout=60000)
    assert seen and seen == sorted(seen) and not page.progress.isVisible()
    assert page.ranking.item(0).text().split()[:2] == ["L1", "H0"] and page._ranked[0][:2] == INDUCTION_HEAD
    assert page.view.heads.shape == (2, 2) and "Induction heads of" in page.caption.text()
    from attn_explorer.gui.analysis.common import untrained_tag

    assert page.caption.text().endswith(untrained_tag(w.state.info))  # the planted weights: said as other pages do
    assert ("Untrained" in page.caption.text()) == (not w.state.info.trained)
    page.top.setValue(1)
    qtbot.mouseClick(page.check_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.induction_check is not None, timeout=60000)
    c = page.induction_check
    assert c.top_heads == [INDUCTION_HEAD] and c.passed and len(c.random) == 5
    assert "matters more" in page.verdict.text() and page.view.bar_plot is not None
    # a click on the planted head's cell selects it in the window
    w.state.select(0, 1)
    click_scene(qtbot, page.canvas, page.view.head_centre(*INDUCTION_HEAD))
    assert (w.state.layer, w.state.head) == INDUCTION_HEAD
    page.ranking.itemClicked.emit(page.ranking.item(1))
    assert (w.state.layer, w.state.head) == page._ranked[1][:2]
    # a new run clears the old result and its check at once
    page.run()
    assert page.induction is None and page.induction_check is None and page.ranking.count() == 0
    qtbot.waitUntil(lambda: page.induction is not None, timeout=60000)
    assert not banners


def test_retrieval_run_grid_shape_and_the_copying_head(make_window, qtbot, planted):
    w, page, banners = lab(make_window, planted)
    page.set_mode("retrieval")
    assert page.lengths.isVisible()
    page.lengths.setText("24,48")
    page.depths.setText("0,0.5,1")
    page.run()
    qtbot.waitUntil(lambda: page.retrieval is not None, timeout=60000)
    r = page.retrieval.result
    assert r.accuracy.shape == (2, 3) and page.view.accuracy.shape == (2, 3)
    assert page._ranked[0][:2] == INDUCTION_HEAD and page.ranking.item(0).text().split()[:2] == ["L1", "H0"]
    assert "actual tokens) 100% on average" in page.caption.text()
    page.top.setValue(1)
    page.check()
    qtbot.waitUntil(lambda: page.retrieval_check is not None, timeout=60000)
    assert page.retrieval_check.top == 0.0 and "matters more" in page.verdict.text()
    assert not banners


def test_bad_lengths_are_one_banner_line_and_nothing_runs(make_window, qtbot, planted):
    w, page, banners = lab(make_window, planted)
    page.set_mode("retrieval")
    for text in ("24,abc", "1000"):
        page.lengths.setText(text)
        page.run()
        assert not page.progress.running and page.retrieval is None
    assert len(banners) == 2 and all("\n" not in b for b in banners)
    assert "whole numbers" in banners[0] and "64 positions" in banners[1]


def test_cancel_by_button_and_by_esc_keeps_nothing(make_window, qtbot, planted):
    w, page, banners = lab(make_window, planted)
    page.set_mode("retrieval")
    page.lengths.setText(",".join(str(n) for n in range(20, 56, 3)))
    page.depths.setText("0,0.25,0.5,0.75,1")
    page.run()
    qtbot.waitUntil(lambda: page.progress.bar.value() > 0, timeout=30000)
    qtbot.mouseClick(page.progress.button, Qt.LeftButton)
    assert page.run_button.isEnabled() and "Cancelled" in page.progress.label.text()
    qtbot.waitUntil(lambda: not page.busy(), timeout=30000)
    assert page.retrieval is None and page.ranking.count() == 0 and "Press Run" in page.stack.placeholder.text()
    page.run()
    qtbot.waitUntil(lambda: page.progress.bar.value() > 0, timeout=30000)
    page.lengths.setFocus()
    qtbot.keyClick(page.lengths, Qt.Key_Escape)
    assert "Cancelled" in page.progress.label.text()
    qtbot.waitUntil(lambda: not page.busy(), timeout=30000)
    qtbot.wait(200)
    assert page.retrieval is None and not banners


def test_a_model_switch_clears_the_results(make_window, qtbot, planted):
    w, page, banners = lab(make_window, planted)
    page.run()
    qtbot.waitUntil(lambda: page.induction is not None, timeout=60000)
    w.state.model_loading.emit("another")
    assert page.induction is None and page.ranking.count() == 0 and page.view.heads is None


def test_an_untrained_model_is_said_and_what_it_cannot_do_is_one_line(make_window, qtbot):
    w = make_window(view="lab")  # the textbook model: seeded random weights, no tokenizer
    page = w.pages["lab"]
    banners = []
    w.state.error_raised.connect(banners.append)
    assert "Untrained model (random weights)" in page.caption.text() and w.state.info.name in page.caption.text()
    page.run()
    qtbot.waitUntil(lambda: bool(banners) and not page.busy(), timeout=30000)
    assert len(banners) == 1 and "\n" not in banners[0] and page.induction is None
    print("textbook lab:", banners[0])
    assert not page.progress.running and page.run_button.isEnabled()
