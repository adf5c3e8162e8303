"""The Switch-off page as a user meets it: click heads off and see the effect, run a scan (progress to 100 %,
Cancel), find a planted head first, click a result to open that head; encoders show the similarity and
the digits classifier its class probabilities."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt

pytest.importorskip("transformers")

from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = "The capital of France is Paris. The capital of Italy is"
PLANTED = (1, 4)


def _click(qtbot, canvas, scene_pos):
    pt = canvas.mapFromScene(scene_pos)
    qtbot.mouseClick(canvas.viewport(), Qt.LeftButton, pos=QPoint(int(pt.x()), int(pt.y())))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A tiny Llama whose L1 H4 writes 30x louder than any other head (its slice of o_proj scaled)."""
    from safetensors.torch import load_file, save_file

    folder = make_llama_folder(tmp_path_factory.mktemp("planted"), seed=3, num_hidden_layers=3)
    path = folder / "model.safetensors"
    weights = load_file(str(path))
    name = f"model.layers.{PLANTED[0]}.self_attn.o_proj.weight"
    d = weights[name].shape[1] // 6
    weights[name][:, PLANTED[1] * d:(PLANTED[1] + 1) * d] *= 30
    save_file(weights, str(path), metadata={"format": "pt"})
    return folder


def _page(make_window, qtbot, model, text=None, image=None):
    w = make_window(model=str(model), text=text, image=image, view="ablation")
    page = w.pages["ablation"]
    qtbot.waitUntil(lambda: page.comparison is not None, timeout=30000)
    return w, page


def test_the_page_renders_and_a_head_switched_off_shows_its_effect(make_window, qtbot, planted):
    w, page = _page(make_window, qtbot, planted, TEXT)
    assert w.current_page_name == "ablation"
    c = page.comparison
    assert c.kind == "decoder" and c.heads == 0 and np.allclose(c.before, c.after)
    assert "All heads on" in page.effect_text.text()
    with qtbot.waitSignal(page.compared, timeout=20000):
        _click(qtbot, page.switches, page.switch_centre(*PLANTED))
    assert page.off == {PLANTED} and page.comparison.heads == 1
    assert np.abs(page.comparison.after - page.comparison.before).max() > 1e-3
    assert "1 off: L1 H4" in page.off_label.text() and "1 head off (set to zero)" in page.effect_text.text()
    np.testing.assert_array_equal(page.switches.image.image[PLANTED], 1.0)
    with qtbot.waitSignal(page.compared, timeout=20000):
        page.how.setCurrentIndex(1)  # mean instead of zero: measured again
    assert "set to its mean" in page.effect_text.text()
    with qtbot.waitSignal(page.compared, timeout=20000):
        page.clear_button.click()
    assert page.off == set() and page.comparison.heads == 0


def test_a_scan_reaches_100_percent_finds_the_planted_head_and_a_click_opens_it(make_window, qtbot, planted):
    w, page = _page(make_window, qtbot, planted, TEXT)
    seen = []
    page.progress.bar.valueChanged.connect(seen.append)
    with qtbot.waitSignal(page.scan_finished, timeout=30000) as done:
        assert page.run_scan()
    assert done.args == [True]
    assert seen and seen[-1] == 1000 and page.progress.isHidden() and page.run_button.isEnabled()
    assert page.scan.values.shape == (3, 6)
    assert page.table_cells()[0][:2] == PLANTED  # the largest effect first
    assert "change of the metric" in page.readout.text() and "the largest: <b>L1 H4</b>" in page.readout.text()
    np.testing.assert_allclose(page.results.image.image, page.scan.effect.astype(np.float32))
    page.results.table.sortItems(3, Qt.AscendingOrder)  # sortable: the most negative effect on top
    effects = [e for _, _, e in page.table_cells()]
    assert effects == sorted(effects)
    _click(qtbot, page.results.canvas, page.scan_centre(0, 2))
    qtbot.waitUntil(lambda: w.current_page_name == "head")
    assert (w.state.layer, w.state.head) == (0, 2)
    w.show_page("ablation")
    page.results.table.sortItems(0, Qt.AscendingOrder)
    row = next(i for i, c in enumerate(page.table_cells()) if c[:2] == PLANTED)
    page.results.table.cellClicked.emit(row, 0)
    assert w.current_page_name == "head" and (w.state.layer, w.state.head) == PLANTED


def test_a_scan_can_be_cancelled(make_window, qtbot, planted):
    w, page = _page(make_window, qtbot, planted, TEXT)
    stopped = []
    page.scan_finished.connect(stopped.append)
    page.progress.bar.valueChanged.connect(lambda v: page.progress.button.click() if page.progress.isVisible() else None)
    assert page.run_scan()
    qtbot.waitUntil(lambda: stopped == [False], timeout=20000)  # cancelled at the first progress report
    qtbot.waitUntil(lambda: not w.state.job_busy("interventions-scan"), timeout=20000)
    qtbot.wait(50)  # a result already queued would arrive here; none may
    assert stopped == [False] and page.scan is None and "cancelled" in page.readout.text()
    assert page.progress.isHidden() and not page.progress.button.isVisible() and page.run_button.isEnabled()


def test_patching_from_the_page_and_bad_input_in_the_banner(make_window, qtbot, planted):
    w, page = _page(make_window, qtbot, planted, "The capital of France is")
    page.scan_kind.setCurrentIndex(2)  # per (layer, position)
    assert page.corrupt.isVisible()
    page.corrupt.setText("The capital of Italy is")
    page.target.setText(" capital")
    with qtbot.waitSignal(page.scan_finished, timeout=30000) as done:
        page.run_scan()
    assert done.args == [True] and page.scan.kind == "patch-position" and page.scan.values.shape == (3, 8)
    assert "corrupt" in page.readout.text()
    layer, pos, _ = page.table_cells()[0]
    page.results.table.cellClicked.emit(0, 0)  # a position cell opens that layer with the position as the query
    assert w.current_page_name == "head" and w.state.layer == layer and w.state.query == pos
    w.show_page("ablation")
    page.corrupt.setText("The capital")  # fewer tokens: one line in the banner, the last good result stays
    shown = page.scan
    with qtbot.waitSignal(w.state.error_raised, timeout=20000) as err:
        page.run_scan()
    assert "same number of tokens" in err.args[0]
    assert page.scan is shown and page.run_button.isEnabled()


def test_an_encoder_shows_the_similarity_and_digits_the_class_probabilities(make_window, qtbot, sample_path):
    w, page = _page(make_window, qtbot, "minilm", "The animal didn't cross the street because it was too tired.")
    with qtbot.waitSignal(page.compared, timeout=20000):
        page.toggle(0, 3)
    assert page.comparison.kind == "similarity" and 0 < page.comparison.similarity < 1
    assert "cosine similarity of the sentence embedding" in page.effect_text.text()
    w2, digits = _page(make_window, qtbot, "tiny-vit-digits", image=sample_path)
    with qtbot.waitSignal(digits.compared, timeout=20000):
        digits.toggle(1, 0)
    c = digits.comparison
    assert c.kind == "classifier" and len(c.labels) == 10 and c.after.sum() == pytest.approx(1, abs=1e-5)
    assert not digits.scan_kind.model().item(1).isEnabled()  # patching needs a second text
