"""The logit-lens page at 1024×700 as a user reads it: the table fits without a sideways scroll bar, the
attribution's labels keep their first characters, the progress bar's text fits and the page's line changes
when the bar completes; the target box offers the lens's tokens. The numbers are stand-ins (the page only
draws what the lens job returns), so these tests do not depend on the analysis floor."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")

from attn_explorer.gui.interventions.lens import visible  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("tiny-llama"), seed=5, num_hidden_layers=3))


def fake_lens(tokens, layers=3, k=5):
    n = len(tokens)
    vocab = [" Paris", " the", "\n", " capital", " Rome", " Italy", "France"]
    top_tokens = [[[vocab[(lv + j + i) % len(vocab)] for i in range(k)] for j in range(n)] for lv in range(layers + 1)]
    probs = np.sort(np.random.default_rng(0).random((layers + 1, n, k)), axis=-1)[..., ::-1]
    return SimpleNamespace(row_names=["embed"] + [f"L{i}" for i in range(layers)], tokens=list(tokens),
                           top_ids=np.zeros((layers + 1, n, k), dtype=np.int64), top_probs=probs,
                           top_tokens=top_tokens, norm="frozen")


def fake_attribution(tokens):
    pieces = [("embeddings", 0.9), ("L2 H5", 0.7), ("MLP 2", -0.6), ("L1 H4", 0.5), ("biases", 0.1)]
    return SimpleNamespace(top=lambda n: pieces[:n], tokens=list(tokens), position=len(tokens) - 1, target=" Paris",
                           heads=np.zeros((3, 6)), mlps=np.zeros(3), total=1.6, logit=1.6, prob=0.2, embeddings=0.9,
                           biases=0.1)


def _lens_page(make_window, qtbot, tiny, size, text=TEXT):
    w = make_window(model=tiny, text=text)
    w.resize(*size)
    w.show_page("lens")
    page = w.pages["lens"]
    qtbot.waitUntil(lambda: not w.state.job_busy("lens-table") and not w.state.job_busy("lens-attribution"),
                    timeout=60000)
    r = w.state.result
    page._lens_ready(r, fake_lens(r.tokens))
    qtbot.waitUntil(lambda: not w.state.job_busy("lens-attribution"), timeout=60000)
    page._attribution_ready(r, fake_attribution(r.tokens))
    qtbot.wait(100)
    return w, page


def test_the_table_fits_and_the_attribution_labels_keep_their_first_characters(make_window, qtbot, tiny):
    # 14 positions or more (the tiny vocabulary cuts words into pieces; SmolLM2 reads the sample sentence as 14)
    w, page = _lens_page(make_window, qtbot, tiny, (1024, 700), text="The capital of France is Paris. Yes")
    assert page.table.columnCount() == len(w.state.result.tokens) >= 14
    assert page.table.horizontalScrollBar().maximum() == 0  # no sideways scrolling
    assert page.table.viewport().width() >= page.table.horizontalHeader().length()
    axis = page.bar_axis
    drawn = axis.drawn_labels()
    assert [t for _, t in drawn] == [name for name, _ in fake_attribution([]).top(14)]
    for px, text in drawn:
        box, shown = axis.left_label_box(px, text)
        assert box.left() >= 0  # inside the axis: the first character is never cut off
        assert shown[0] == text[0]
    # the target box offers the lens's own next tokens at the attributed position, white space drawn
    assert [page.target_edit.itemText(i) for i in range(page.target_edit.count())] == \
        [visible(t, None) for t in page.table.lens.top_tokens[-1][page.position]]
    page.target_edit.setCurrentIndex(0)
    assert page.target_edit.text() == page.target_edit.tokens()[0]
    assert page.target_edit.tokens() == page.table.lens.top_tokens[-1][page.position]


def test_the_progress_text_fits_and_the_line_changes_when_the_bar_completes(make_window, qtbot, tiny):
    w, page = _lens_page(make_window, qtbot, tiny, (1024, 700))
    page.stack.show_message("Reading every layer's residual stream through the unembedding…")
    page.progress.start("", "Logit lens %p%")  # the frame's progress line, as a job starts it
    qtbot.wait(50)
    assert page.progress.bar.height() >= page.progress.bar.fontMetrics().height() + 4  # the text is not clipped
    page._progressed(0.5, "")
    assert "Reading" in page.stack.placeholder.text()
    page._progressed(1.0, "")  # every layer read: the line says what happens now, with the bar at 100 %
    assert page.progress.fraction == 1.0 and "Reading" not in page.stack.placeholder.text()


