"""The Atlas page as a user meets it, on the planted tiny GPT-2 (layer 0 head 0 a previous-token head, layer 1
head 0 an induction head): run with progress, cancel (the button and Esc), a click on a head lists its
examples, a click on an example opens the One-head view with that query, save and open, a new run clears the
old, two atlases linked."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from tests.analysis.atlas_planted import make_planted_folder, repeated_documents


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return str(make_planted_folder(tmp_path_factory.mktemp("planted")))


def corpus(tmp_path, n=6, half=12, seed=0):
    d = tmp_path / f"corpus{n}-{seed}"
    d.mkdir(exist_ok=True)
    for i, text in enumerate(repeated_documents(n, half=half, seed=seed)):
        (d / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
    return d


def built(make_window, qtbot, planted, tmp_path, n=6):
    w = make_window(model=planted, view="atlas")
    page = w.pages["atlas"]
    assert page.set_corpus([str(corpus(tmp_path, n))])
    assert f"{n} documents" in page.caption.text()
    page.run()
    qtbot.waitUntil(lambda: page.atlas is not None, timeout=60000)
    return w, page


def building(make_window, qtbot, planted, tmp_path):
    """A build of 400 documents at the largest budget, started and past its first progress step: (w, page)."""
    w = make_window(model=planted, view="atlas")
    page = w.pages["atlas"]
    page.set_corpus([str(corpus(tmp_path, 400, half=30))])
    page.budget.setValue(page.budget.maximum())
    page.run()
    qtbot.waitUntil(lambda: page.progress.bar.value() > 0, timeout=30000)
    return w, page


def click_scene(qtbot, canvas, scene_pos):
    view_pos = canvas.mapFromScene(scene_pos)
    qtbot.mouseClick(canvas.viewport(), Qt.LeftButton, pos=view_pos)


def test_run_shows_progress_every_head_and_the_roles(make_window, qtbot, planted, tmp_path):
    w = make_window(model=planted, view="atlas")
    page = w.pages["atlas"]
    page.set_corpus([str(corpus(tmp_path, 8))])
    seen = []
    page.progress.bar.valueChanged.connect(seen.append)
    qtbot.mouseClick(page.run_button, Qt.LeftButton)
    assert page.progress.isVisible() and not page.run_button.isEnabled()
    qtbot.waitUntil(lambda: page.atlas is not None, timeout=60000)
    assert seen and seen == sorted(seen) and seen[-1] == page.progress.bar.maximum()
    assert not page.progress.isVisible() and page.run_button.isEnabled() and page.save_button.isEnabled()
    assert f"of <b>{page.atlas.model}</b>" in page.caption.text() and "built here" in page.caption.text()
    x, y = page.scatter.points.getData()
    assert len(x) == 4  # 2 layers x 2 heads
    np.testing.assert_allclose(sorted(x), sorted(page.atlas.metrics["prev_token"].ravel()))
    assert page.roles.get((0, 0)) and "previous-token" in page.roles[(0, 0)]
    roles = page.side.roles.text()
    assert "<b>previous-token</b> (prev_token ≥ 0.4): L0 H0" in roles
    assert "(retrieval ≥ 0.1): not in this atlas" in roles  # the lab measures it, not the atlas
    page.view_combo.setCurrentIndex(page.view_combo.findData("pca"))
    qtbot.waitUntil(lambda: page._projection is not None, timeout=30000)
    assert "PCA 1" in page.scatter.plot.getAxis("bottom").labelText and not page.x_combo.isEnabled()


def test_cancel_by_button_and_by_esc_keeps_nothing(make_window, qtbot, planted, tmp_path):
    w, page = building(make_window, qtbot, planted, tmp_path)
    qtbot.mouseClick(page.progress.button, Qt.LeftButton)
    assert page.run_button.isEnabled() and "Cancelled" in page.progress.label.text()
    qtbot.waitUntil(lambda: not page.busy(), timeout=30000)
    assert page.atlas is None and "Cancelled" in page.stack.placeholder.text()
    page.run()
    qtbot.waitUntil(lambda: page.progress.bar.value() > 0, timeout=30000)
    page.budget.setFocus()
    qtbot.keyClick(page.budget, Qt.Key_Escape)
    assert not page.progress.running and page.run_button.isEnabled()
    qtbot.waitUntil(lambda: not page.busy(), timeout=30000)
    qtbot.wait(200)
    assert page.atlas is None


def test_a_click_on_a_head_lists_its_examples_and_a_click_on_one_opens_the_one_head_view(make_window, qtbot,
                                                                                        planted, tmp_path):
    w, page = built(make_window, qtbot, planted, tmp_path)
    w.show_page("atlas")
    qtbot.wait(50)
    click_scene(qtbot, page.canvas, page.scatter.scene_pos_of((1, 0)))
    assert page.selected == (1, 0)
    assert "L1 H0" in page.side.title.text() and page.side.list.count() == len(page.side.examples) > 0
    ex = page.side.examples[1]
    assert ex.metric == "weight"
    label = page.side.list.itemWidget(page.side.row_of(1)).text()
    assert "background:#ffd54f" in label and "background:#80deea" in label  # query and key marked
    item = page.side.row_of(1)
    qtbot.mouseClick(page.side.list.viewport(), Qt.LeftButton, pos=page.side.list.visualItemRect(item).center())
    qtbot.waitUntil(lambda: w.current_page_name == "head", timeout=30000)
    assert w.state.text == page.atlas.texts[ex.doc]
    assert w.state.query == ex.query and (w.state.layer, w.state.head) == (1, 0)
    assert w.state.result.tokens[ex.query] == ex.tokens[ex.query_at]


def test_save_and_open_round_trip_and_an_opened_atlas_names_its_model(make_window, qtbot, planted, tmp_path):
    w, page = built(make_window, qtbot, planted, tmp_path)
    path = tmp_path / "a.npz"
    page.save(str(path))
    qtbot.waitUntil(lambda: "Saved" in page.readout.text(), timeout=30000)
    before = page.atlas
    page.select_head(0, 0)
    page.open(str(path))
    qtbot.waitUntil(lambda: page.atlas is not before and page.atlas is not None, timeout=30000)
    assert "opened from a.npz" in page.caption.text() and before.model in page.caption.text()
    assert page.selected is None and page.side.list.count() == 0  # the old selection went with the old atlas
    for k, v in before.metrics.items():
        np.testing.assert_array_equal(v, page.atlas.metrics[k])
    page.select_head(1, 0)
    page.open_example(0)  # opens without the run that made it: the atlas keeps the texts
    qtbot.waitUntil(lambda: w.current_page_name == "head", timeout=30000)
    assert w.state.query == page.side.examples[0].query
    lines = []
    w.state.error_raised.connect(lines.append)
    w.state.load_model("textbook")
    qtbot.waitUntil(lambda: w.state.info.name == "textbook", timeout=30000)
    assert "The loaded model is textbook" in page.caption.text()
    page.open_example(0)
    assert lines and "load " + before.model in lines[-1]


def test_a_new_run_clears_the_old_examples_and_selection(make_window, qtbot, planted, tmp_path):
    w, page = built(make_window, qtbot, planted, tmp_path)
    page.select_head(1, 0)
    assert page.side.list.count() > 0
    page.run()
    assert page.atlas is None and page.selected is None and page.side.list.count() == 0
    assert len(page.scatter.points.getData()[0]) == 0
    qtbot.waitUntil(lambda: page.atlas is not None, timeout=60000)
    assert page.selected is None


def test_two_atlases_linked(make_window, qtbot, planted, tmp_path):
    w, page = built(make_window, qtbot, planted, tmp_path)
    pair = page.pair
    pair.model_edit.setText(planted)  # the same model again: every head matches itself, similarity 1
    pair.run()
    qtbot.waitUntil(lambda: pair.atlas is not None and bool(pair.pairs), timeout=60000)
    assert pair.holder.model is not None
    page.select_head(1, 0)
    lb, hb, s = pair.a2b[(1, 0)]
    assert (lb, hb) == (1, 0) and s == pytest.approx(1.0)
    ring = pair.scatter.match_ring.getData()
    i = pair.scatter.index((1, 0))
    assert ring[0][0] == pytest.approx(pair.scatter.xy[i, 0]) and ring[1][0] == pytest.approx(pair.scatter.xy[i, 1])
    assert "similarity 1.00" in page.readout.text() and "similarity 1.00" in page.side.numbers.text()
    assert "Second atlas" in page.caption.text() and "built here; 4 heads matched" in page.caption.text()
    # a click on the second scatter selects its partner on the first
    w.show_page("atlas")
    qtbot.wait(50)
    click_scene(qtbot, page.canvas, pair.scatter.scene_pos_of((0, 0)))
    assert page.selected == pair.b2a[(0, 0)][:2]
    # same prompt, two models: both maps, the same here
    pair.prompt_edit.setText("alpha bravo alpha bravo")
    pair.show_prompt()
    qtbot.waitUntil(lambda: all(p.matrix is not None for p in pair.heat), timeout=30000)
    np.testing.assert_allclose(pair.heat[0].matrix, pair.heat[1].matrix)
    # a second atlas opened from a file has no model: one line says so, and its top example stands in
    path = tmp_path / "b.npz"
    pair.atlas.save(str(path))
    pair.open(str(path))
    qtbot.waitUntil(lambda: pair.atlas is not None and "opened" in pair.source and bool(pair.pairs), timeout=30000)
    page.select_head(1, 0)
    pair.show_prompt()
    assert pair.prompt_note.isVisible() and "without its model" in pair.prompt_note.text()


def test_hover_names_the_head_and_its_metrics(make_window, qtbot, planted, tmp_path):
    w, page = built(make_window, qtbot, planted, tmp_path)
    w.show_page("atlas")
    qtbot.wait(50)
    page._hovered(page.scatter.scene_pos_of((1, 0)))
    text = page.readout.text()
    v = page.atlas.metrics["induction"][1, 0]
    assert text.startswith("L1 H0: prev_token ") and f"induction {v:.2f}" in text and "entropy" in text


def test_a_bad_second_model_is_one_banner_line_and_the_first_stays(make_window, qtbot, planted, tmp_path):
    w, page = built(make_window, qtbot, planted, tmp_path)
    lines = []
    w.state.error_raised.connect(lines.append)
    page.pair.model_edit.setText(str(tmp_path / "no-such-model"))
    page.pair.run()
    qtbot.waitUntil(lambda: bool(lines), timeout=30000)
    assert len(lines) == 1 and "\n" not in lines[0] and "Traceback" not in lines[0]
    assert not page.progress.running and page.run_button.isEnabled()
    assert page.atlas is not None and page.pair.atlas is None


def test_a_model_load_stops_the_build_and_says_so(make_window, qtbot, planted, tmp_path):
    w, page = building(make_window, qtbot, planted, tmp_path)
    w.state.load_model("textbook")
    assert "model changed" in page.progress.label.text() and page.run_button.isEnabled()
    qtbot.waitUntil(lambda: w.state.info.name == "textbook", timeout=30000)
    qtbot.waitUntil(lambda: not page.busy(), timeout=30000)
    assert page.atlas is None
