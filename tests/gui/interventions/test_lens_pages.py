"""The logit-lens, contribution-graph and why-this-head pages as a user meets them, on a tiny random Llama: each
draws, says its convention, reaches 100 % and can be cancelled, and its clicks lead to a head's map. No torch runs
on the GUI thread meanwhile."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PySide6.QtCore import QPoint, Qt

from attn_explorer.gui.interventions.lens import visible
from tests.gui.lessons.test_gui_thread import TorchCalls
from tests.tiny_llama import make_llama_folder

TEXT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("tiny-llama"), seed=5, num_hidden_layers=3))


def _click_scene(qtbot, canvas, scene_pos, double=False):
    pt = canvas.mapFromScene(scene_pos)
    pos = QPoint(int(pt.x()), int(pt.y()))
    (qtbot.mouseDClick if double else qtbot.mouseClick)(canvas.viewport(), Qt.LeftButton, pos=pos)


def _next_tokens(window):
    """The model's own next token at every position, from the module itself (the reference)."""
    m = window.state._model
    ids = m.prepare(TEXT).inputs["input_ids"]
    with torch.inference_mode():
        logits = m.module.logits(m.module(input_ids=ids).hidden)[0]
    return m.tokenizer.display(logits.argmax(-1).tolist())


def test_lens_page_table_attribution_and_a_head(make_window, qtbot, tiny):
    w = make_window(model=tiny, text=TEXT)
    page = w.pages["lens"]
    recorder = TorchCalls()
    seen = []
    page.progress.bar.valueChanged.connect(seen.append)
    with recorder:
        w.show_page("lens")
        qtbot.waitUntil(lambda: page.attribution is not None, timeout=60000)
    assert not recorder.calls, recorder.report()
    L, N = w.state.info.num_layers, len(w.state.result.tokens)
    t = page.table
    assert (t.rowCount(), t.columnCount()) == (L + 1, N)
    assert t.verticalHeaderItem(0).text() == f"after L{L - 1}" and t.verticalHeaderItem(L).text() == "embeddings"
    assert t.texts()[0] == [visible(x) for x in _next_tokens(w)]  # the top row is the model's own prediction
    assert "frozen" in page.caption.text() and 1000 in seen and page.progress.isHidden()
    a = page.attribution
    assert a.position == N - 1 and abs(a.total - a.logit) < 1e-4
    assert f"{a.logit:.4f}" in page.readout.text() and f"{a.total:.4f}" in page.readout.text()
    # a click on a cell attributes that position
    rect = t.visualItemRect(t.item(1, 2))
    qtbot.mouseClick(t.viewport(), Qt.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: page.attribution.position == 2, timeout=30000)
    # the other norm reading redraws the table and says so
    page.norm_box.setCurrentIndex(1)
    qtbot.waitUntil(lambda: page.table.lens is not None and page.table.lens.norm == "own", timeout=30000)
    assert "own scale" in page.caption.text()
    qtbot.waitUntil(lambda: page.attribution is not None and bool(page.pieces), timeout=30000)
    # a head's bar opens its map
    i = next(k for k, (name, _) in enumerate(page.pieces) if " H" in name)
    layer, head = (int(v) for v in page.pieces[i][0][1:].split(" H"))
    _click_scene(qtbot, page.bars_canvas, page.bar_center(i))
    qtbot.waitUntil(lambda: w.current_page_name == "head")
    assert (w.state.layer, w.state.head) == (layer, head)


def test_a_bad_target_is_one_banner_line(make_window, qtbot, tiny):
    w = make_window(model=tiny, text=TEXT)
    page = w.pages["lens"]
    w.show_page("lens")
    qtbot.waitUntil(lambda: page.attribution is not None, timeout=60000)
    page.target_edit.setText("Paris")  # three tokens in the tiny vocabulary
    with qtbot.waitSignal(w.state.error_raised, timeout=30000) as blocker:
        page.target_edit.returnPressed.emit()
    assert "3 tokens here" in blocker.args[0] and "\n" not in blocker.args[0]
    assert page.dla_title.text() == "" and page.table.lens is not None  # the lens table stays
    page.target_edit.setText(" capital")
    page.target_edit.returnPressed.emit()
    qtbot.waitUntil(lambda: page.attribution is not None and page.attribution.target == " capital", timeout=30000)


def test_lens_job_can_be_cancelled(make_window, qtbot, tiny):
    w = make_window(model=tiny, text=TEXT)
    page = w.pages["lens"]
    w.show_page("lens")
    qtbot.waitUntil(lambda: page.table.lens is not None, timeout=60000)
    page.measure()
    assert page.progress.button.isVisible()
    qtbot.mouseClick(page.progress.button, Qt.LeftButton)
    assert page.progress.isHidden() and "Cancelled" in page.stack.placeholder.text()
    qtbot.waitUntil(lambda: not w.state.job_busy("lens-table"), timeout=30000)
    qtbot.waitUntil(lambda: not w.state.job_busy("lens-attribution"), timeout=30000)
    assert page.table.lens is None and page.attribution is None  # nothing arrived after the cancel
    assert page.stack.currentWidget() is page.stack.placeholder


def test_flow_page_threshold_edge_panel_and_head(make_window, qtbot, tiny):
    w = make_window(model=tiny, text=TEXT)
    page = w.pages["flow"]
    seen = []
    page.progress.bar.valueChanged.connect(seen.append)
    recorder = TorchCalls()
    with recorder:
        w.show_page("flow")
        qtbot.waitUntil(lambda: page.graph is not None, timeout=60000)
        page.slider.setValue(3)  # tracing again happens here, in NumPy
    assert not recorder.calls, recorder.report()
    assert 1000 in seen and page.output_box.currentIndex() == len(w.state.result.tokens) - 1
    page.slider.setValue(1)
    many = len(page.edges)
    page.slider.setValue(30)
    assert len(page.edges) < many and "0.30" in page.caption.text() and page.threshold_label.text() == "0.30"
    page.slider.setValue(2)
    attn = [e for e in page.edges if e.kind == "attn" and e.src != e.dst]
    assert attn and all(e.weight >= 0.02 for e in page.edges)
    e = max(attn, key=lambda e: e.weight)
    _click_scene(qtbot, page.canvas, page.edge_point(e))
    assert page.chosen == e and f"L{e.layer}" in page.panel.text()
    qtbot.waitUntil(lambda: "promotes" in page.tokens_label.text(), timeout=30000)
    assert page.open_button.isEnabled() and f"L{e.layer} H{e.head}" in page.open_button.text()
    qtbot.mouseClick(page.open_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.current_page_name == "head")
    assert (w.state.layer, w.state.head) == (e.layer, e.head)
    # a double click on an edge opens its head at once
    w.show_page("flow")
    w.state.select((e.layer + 1) % w.state.info.num_layers, e.head)
    _click_scene(qtbot, page.canvas, page.edge_point(e), double=True)
    qtbot.waitUntil(lambda: w.current_page_name == "head")
    assert page.chosen == e and (w.state.layer, w.state.head) == (e.layer, e.head)


def test_why_page_sums_and_opens_a_writer(make_window, qtbot, tiny):
    w = make_window(model=tiny, text=TEXT)
    w.state.select(2, 3)
    page = w.pages["why"]
    seen = []
    page.progress.bar.valueChanged.connect(seen.append)
    recorder = TorchCalls()
    with recorder:
        w.show_page("why")
        qtbot.waitUntil(lambda: page.why is not None, timeout=60000)
        page.shown_spin.setValue(4)  # condensing again happens here, in NumPy
    assert not recorder.calls, recorder.report()
    why = page.why
    assert (why.layer, why.head, why.query) == (2, 3, w.state.query)
    assert 1000 in seen and page.progress.isHidden()
    row = w.state.result.attentions[2, 3, why.query, : why.query + 1]
    assert why.key == int(np.argmax(row))  # the key the head weighs most
    assert abs(why.total - why.logit) < 1e-4 and f"{why.logit:.4f}" in page.readout.text()
    names, heads = page.shown
    assert page.table.rowCount() == len(names) + 1 and abs(page.table.values[:-1].sum() - why.logit) < 1e-4
    # picking another key asks again at once
    page.key_box.setCurrentIndex(0 if why.key else 1)
    qtbot.waitUntil(lambda: page.why is not None and page.why.key == (0 if why.key else 1), timeout=30000)
    assert abs(page.why.total - page.why.logit) < 1e-4 and f"key {page.why.key}" in page.caption.text()
    # a cancel says how to come back, and changing the key does
    page.key_box.setCurrentIndex(2)  # another key than the two above: a job starts
    assert page.progress.button.isVisible()
    qtbot.mouseClick(page.progress.button, Qt.LeftButton)
    assert "Change the layer, head, query or key" in page.stack.placeholder.text() and page.caption.text() == ""
    page.key_box.setCurrentIndex(0)
    qtbot.waitUntil(lambda: page.why is not None and page.why.key == 0, timeout=30000)
    names, heads = page.shown
    k = next(i for i, h in enumerate(heads) if h is not None)
    page.table.verticalHeader().sectionClicked.emit(k)
    qtbot.waitUntil(lambda: w.current_page_name == "head")
    assert (w.state.layer, w.state.head) == heads[k]


def test_an_encoder_gets_one_line_instead(make_window, qtbot):
    w = make_window(model="textbook", text="the cat sat on the mat")
    for name in ("lens", "flow", "why"):
        w.show_page(name)
        page = w.pages[name]
        qtbot.waitUntil(lambda: "needs a decoder" in page.stack.placeholder.text(), timeout=10000)
        assert page.stack.currentWidget() is page.stack.placeholder and not page.progress.isVisible()


def test_pages_fit_1024_by_700(make_window, qtbot, tiny):
    """Nothing to scroll to at the smallest supported size: the graph's token axis and the bar of controls show."""
    w = make_window(model=tiny, text=TEXT)
    w.resize(1024, 700)
    ready = {"lens": lambda p: p.attribution is not None, "flow": lambda p: p.graph is not None,
             "why": lambda p: p.why is not None}
    for name, done in ready.items():
        w.show_page(name)
        page = w.pages[name]
        qtbot.waitUntil(lambda: done(page), timeout=60000)
        holder = w._tab_of[name]
        qtbot.waitUntil(lambda: not holder.verticalScrollBar().isVisible()
                        and not holder.horizontalScrollBar().isVisible(), timeout=5000)
        assert page.height() <= holder.viewport().height() and page.width() <= holder.viewport().width()


def test_emptied_input_clears_and_unused_options_are_named(make_window, qtbot, tiny):
    w = make_window(model=tiny, text=TEXT)
    page = w.pages["flow"]
    w.show_page("flow")
    qtbot.waitUntil(lambda: page.graph is not None, timeout=60000)
    assert page.note.isHidden()
    w.state.set_options(hide_special=True)
    assert page.note.isVisible() and "Hide specials: not used here" in page.note.text()
    w.state.set_text("")
    qtbot.waitUntil(lambda: page.stack.currentWidget() is page.stack.placeholder, timeout=10000)
    assert page.caption.text() == "" and page.readout.text() == ""  # nothing on screen describes the old text
