"""Issue 26 B: the one-head view shows a vision-language run's image tokens as labelled bands ("image tile 1 (t0),
2 × 2", "image 4 × 4") from the run's image-token positions, and its crowded axes name each block once and keep
the text tokens' words (tiny random LLaVA and Idefics3 built by tests/hub/test_parity_vlm.make)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from attn_explorer.session.vlm import image_blocks  # noqa: E402
from tests.gui.window.test_vlm_window import PROMPT, _ready, _window, llava, vlm_folder  # noqa: E402,F401

IDEFICS_PROMPT = "User:<image>the cat sat<end_of_utterance>\nAssistant:"


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory):
    return vlm_folder(tmp_path_factory, "idefics3")


def _head(qtbot, w, st):
    w.show_page("head")
    r = st.result
    qtbot.waitUntil(lambda: len(w.head_view.tokens) == r.num_tokens and getattr(w.head_view, "bands", None)
                    is not None, timeout=30000)
    return w.head_view, r


def test_one_view_is_one_band(qtbot, settings, llava):
    folder, img = llava
    w, st = _window(qtbot, settings, model=str(folder), image=str(img), text=PROMPT)
    _ready(qtbot, st, "image-text")
    view, r = _head(qtbot, w, st)
    pos = r.image_token_positions
    (b,) = view.bands.blocks
    assert (b.start, b.stop) == (int(pos[:, 0].min()), int(pos[:, 0].max()) + 1) and b.label == "image 4 × 4"
    assert view.bands.spans == [(b.start, b.stop)] and view.left_axis.blocks == [(b.start, b.stop, "image 4×4")]
    assert view.bottom_axis.blocks == view.left_axis.blocks
    assert all(view.tokens[i].startswith("<image") for i in range(b.start, b.stop))
    assert not any(t.startswith("<image") for i, t in enumerate(view.tokens) if not b.start <= i < b.stop)
    assert len(view.bands._items) == 4  # the block's two edges, across the rows and down the columns
    st.shutdown()


def test_tiles_are_named_bands_and_hidden_specials_move_them(qtbot, settings, idefics3):
    folder, img = idefics3
    w, st = _window(qtbot, settings, model=str(folder), image=str(img), text=IDEFICS_PROMPT)
    _ready(qtbot, st, "image-text")
    view, r = _head(qtbot, w, st)
    labels = [b.label for b in view.bands.blocks]
    assert labels == [f"image tile {k + 1} (t{k}), 2 × 2" for k in range(4)] + ["image global view, 2 × 2"]
    for b, (a, z) in zip(view.bands.blocks, view.bands.spans):
        assert z - a == 4 == b.stop - b.start  # 2 × 2 tokens a view (the 2 × 2 pixel shuffle)
        want = "global" if b.tile == 4 else f"t{b.tile}"
        assert all(view.tokens[i].startswith(f"<image {want} ") for i in range(a, z))
    # with the specials hidden, the rows before the picture go: each band follows its tokens (the tiny tokenizer
    # marks no token of this prompt special: the run's first two are marked so here)
    r.special = [i < 2 or s for i, s in enumerate(r.special)]
    st.set_options(hide_special=True)
    qtbot.waitUntil(lambda: len(view.tokens) < r.num_tokens, timeout=30000)
    assert view.bands.spans != [(b.start, b.stop) for b in view.bands.blocks]
    for b, (a, z) in zip(view.bands.blocks, view.bands.spans):
        assert list(view.shown_rows[a:z]) == list(range(b.start, b.stop))
    st.shutdown()


def test_a_text_run_has_no_bands(qtbot, settings):
    w, st = _window(qtbot, settings, model="textbook", text="the cat sat on the mat")
    _ready(qtbot, st, "text")
    view, r = _head(qtbot, w, st)
    assert image_blocks(r) == [] and view.bands.blocks == [] and view.left_axis.blocks == []
    st.shutdown()


def test_a_crowded_axis_names_the_block_once_and_keeps_the_words(qtbot):
    """1,024 image tokens and 12 words on 300 px: every k-th token would be an image token; the banded axis
    draws the block's name and the words that fit, and every token once zoomed in."""
    import pyqtgraph as pg

    from attn_explorer.gui.explorer.image_bands import BandedAxis

    words = ["USER", ":", "\n"] + [f"<image r{i // 32}c{i % 32}>" for i in range(1024)] + \
        ["where", " is", " the", " cat", " in", " this", " picture", "?", " ASSISTANT", ":"]
    w = pg.GraphicsLayoutWidget()
    qtbot.addWidget(w)
    axis = BandedAxis("left")
    plot = w.addPlot(axisItems={"left": axis})
    w.resize(400, 300)
    w.show()
    axis.set_labels(words)
    plot.setYRange(0, len(words), padding=0)
    qtbot.waitUntil(lambda: axis.token_step() > 1, timeout=5000)
    plain = [t for _, t in axis.drawn_labels()]
    assert any(t.startswith("<image") for t in plain)  # without blocks: every k-th token, mostly image tokens
    axis.set_blocks([(3, 1027, "image 32×32")])
    drawn = axis.drawn_labels()
    text = [t for _, t in drawn]
    assert "▮ image 32×32" in text and not any(t.startswith("<image") for t in text)
    assert set(text) & set(words[:3]) and set(text) & set(words[-10:])  # a word of the prompt on each side of the picture
    px = sorted(p for p, _ in drawn)
    assert all(b - a >= axis._room() - 1e-6 for a, b in zip(px, px[1:]))  # no two labels overlap
    plot.setYRange(990, len(words), padding=0)  # the picture's end and the question: still crowded, the words named
    qtbot.waitUntil(lambda: axis.token_step() > 1 and axis.drawn_labels() != drawn, timeout=5000)
    text = [t for _, t in axis.drawn_labels()]
    assert "▮ image 32×32" in text and sum(t in words[-10:] for t in text) >= 3
    assert not any(t.startswith("<image") for t in text)
    plot.setYRange(1016, 1028, padding=0)  # zoomed in: every token named, image tokens too
    qtbot.waitUntil(lambda: axis.token_step() == 1, timeout=5000)
    assert "<image r31c31>" in [t for _, t in axis.drawn_labels()]
    assert np.all(np.diff([p for p, _ in axis.drawn_labels()]) != 0)
