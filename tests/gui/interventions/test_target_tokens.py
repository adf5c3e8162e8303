"""Tokens as the Switch-off page shows and takes them: the bars draw the leading space (␣) and the newline (↵),
the target box offers the bars' tokens and gives back the exact token picked, every bar has its label at
1024×700, and a per-position scan's columns go with the scan."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from attn_explorer.gui.widgets.tokens import TokenPicker, token_from_text, token_text  # noqa: E402
from tests.gui.interventions.test_ablation_page import TEXT, planted  # noqa: E402,F401 - the fixture


def _page(make_window, qtbot, model, text=TEXT, size=None):
    w = make_window(model=str(model), text=text, view="ablation")
    if size:
        w.resize(*size)
    page = w.pages["ablation"]
    qtbot.waitUntil(lambda: page.comparison is not None, timeout=30000)
    return w, page


def test_token_text_draws_white_space_and_reads_back():
    assert token_text(" Mary") == "␣Mary"
    assert token_text("\n") == "↵" and token_text("\n\n") == "↵↵"
    assert token_text("") == "∅"
    for t in (" Mary", "Mary", "\n", " \n\t x", ""):
        assert token_from_text(token_text(t)) == t


def test_a_byte_level_newline_token_is_drawn_as_a_newline():
    """SmolLM2's newline token 'Ċ' reaches the views as backslash-n (hub.text's display): it was printed as
    '\\n' in the lens table and the bars; it is drawn ↵, and picking it gives the newline the tokenizer reads."""
    from attn_explorer.hub.text import _display

    shown = token_text(_display("Ċ"))
    assert shown == "↵" and token_text(_display("ĠĊ")) == "␣↵"
    assert token_from_text(shown) == "\n"


def test_the_bars_show_the_leading_space_and_the_target_list_gives_the_exact_token(make_window, qtbot, planted):
    w, page = _page(make_window, qtbot, planted)
    c = page.comparison
    labels = list(c.labels)
    assert any(t.startswith(" ") for t in labels)  # the tiny vocabulary has tokens with a leading space
    # the bars name each token as it is: " capital" reads "␣capital", never "capital"
    assert page.effect_bars.axis._labels == [token_text(t) for t in labels]
    # the target box offers the bars' tokens, drawn the same way, most likely first
    assert page.target.tokens()[: len(labels)] == labels or set(labels) <= set(page.target.tokens())
    spaced = next(i for i, t in enumerate(page.target.tokens()) if t.startswith(" "))
    assert page.target.itemText(spaced).startswith("␣")
    page.target.setCurrentIndex(spaced)  # the user picks it from the list
    assert page.target.text() == page.target.tokens()[spaced]  # " capital", with its space
    page.target.setEditText("␣" + page.target.tokens()[spaced][1:])  # or types it as the list shows it
    assert page.target.text() == page.target.tokens()[spaced]


def test_every_bar_is_labelled_at_1024_by_700(make_window, qtbot, planted):
    w, page = _page(make_window, qtbot, planted, size=(1024, 700))
    with qtbot.waitSignal(page.compared, timeout=20000):
        page.toggle(1, 4)  # clean and heads-off top tokens differ: up to twice as many bars
    qtbot.wait(50)
    n = len(page.comparison.labels)
    assert n >= 7
    assert len(page.effect_bars.axis.drawn_labels()) == n
    w.resize(1920, 1080)
    qtbot.wait(50)
    assert len(page.effect_bars.axis.drawn_labels()) == n


def test_a_per_position_scan_column_goes_with_the_scan(make_window, qtbot, planted):
    w, page = _page(make_window, qtbot, planted, "The capital of France is")
    page.scan_kind.setCurrentIndex(2)  # patch per position
    page.corrupt.setText("The capital of Italy is")
    with qtbot.waitSignal(page.scan_finished, timeout=60000):
        page.run_scan()
    header = lambda j: page.results.table.horizontalHeaderItem(j).text()  # noqa: E731
    assert header(2) == "pos" and page.results.table.rowCount() > 0
    page.scan_kind.setCurrentIndex(0)  # another kind of scan: the positions' table is not its table
    assert page.results.table.rowCount() == 0 and header(2) == "H"
    page.scan_kind.setCurrentIndex(2)
    with qtbot.waitSignal(page.scan_finished, timeout=60000):
        page.run_scan()
    assert header(2) == "pos"
    w.state.load_model("tiny-vit-digits", want_image=True)  # the image model: no positions to patch
    qtbot.waitUntil(lambda: w.state.info is not None and w.state.info.modality == "image", timeout=60000)
    assert page.results.table.rowCount() == 0 and header(2) == "H"


def test_the_generate_bars_draw_newline_and_space(qtbot):
    from types import SimpleNamespace

    from attn_explorer.gui.generate.page import GeneratePage
    from attn_explorer.session.state import SessionState

    state = SessionState(device="cpu")
    page = GeneratePage(state)
    qtbot.addWidget(page)
    step = SimpleNamespace(index=0, text="\n", token="\n", top_tokens=["\n", " Mary", "Mary"],
                           top_probs=np.array([0.5, 0.3, 0.2]), ms=1.0,
                           attention=np.full((1, 1, 3), 1 / 3, dtype=np.float32))
    page.session.steps.append(step)
    page.session.sink.append(1 / 3)
    page._step(step)
    ticks = page.bars_plot.getAxis("left")._tickLevels[0]
    assert [t for _, t in ticks] == ["↵", "␣Mary", "Mary"]
    state.shutdown()


def test_token_picker_keeps_a_line_edits_api(qtbot):
    box = TokenPicker()
    qtbot.addWidget(box)
    box.set_tokens([" Mary", "Mary", "\n"])
    assert [box.itemText(i) for i in range(box.count())] == ["␣Mary", "Mary", "↵"]
    assert box.text() == ""
    box.setText(" John")
    assert box.currentText() == "␣John" and box.text() == " John"
    box.set_tokens([" Paris"])  # new bars: what was typed stays
    assert box.text() == " John"
    with qtbot.waitSignal(box.returnPressed, timeout=1000):
        box.lineEdit().returnPressed.emit()
    box.clear()
    assert box.text() == "" and box.count() == 0
