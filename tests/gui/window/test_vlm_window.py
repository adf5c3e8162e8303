"""Issue 26 B: a vision-language model in the window (a tiny random LLaVA built by tests/hub/test_parity_vlm):
the picture and the prompt both reach the run, the text box says which tokens are the image, the overlay
page draws a text token's attention back on the picture (computed in the session's worker), and a text model
afterwards runs text again."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

pytest.importorskip("transformers")

from attn_explorer.gui.window.app import build_window, get_qapp  # noqa: E402
from tests.gui.conftest import cached_loader  # noqa: E402
from tests.hub.test_parity_vlm import make, picture  # noqa: E402

PROMPT = "USER: <image>\nthe cat sat ASSISTANT:"


def vlm_folder(tmp_path_factory, name):
    """A tiny random name (tests/hub/test_parity_vlm.make) with picture.png beside it: (folder, picture)."""
    from PIL import Image

    folder = tmp_path_factory.mktemp(name)
    make(folder, name)
    img = folder / "picture.png"
    Image.fromarray(picture()).save(img)
    return folder, img


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return vlm_folder(tmp_path_factory, "llava")


def _window(qtbot, settings, **kw):
    get_qapp()
    args = argparse.Namespace(**{"model": None, "text": None, "image": None, "device": "cpu", "view": None,
                                 "screenshot": None, "session": None, "open": None, **kw})
    w, st = build_window(args, settings=settings, loader=cached_loader)
    qtbot.addWidget(w)
    w.resize(1300, 850)
    w.show()
    return w, st


def _ready(qtbot, st, modality):
    qtbot.waitUntil(lambda: not st.busy and st.info is not None and st.info.modality == modality
                    and st.result is not None, timeout=60000)


def _page(qtbot, settings, llava, name):
    """The window on llava's picture and PROMPT, its run done, showing page name: (folder, w, st, page)."""
    folder, img = llava
    w, st = _window(qtbot, settings, model=str(folder), image=str(img), text=PROMPT)
    _ready(qtbot, st, "image-text")
    w.show_page(name)
    return folder, w, st, w.pages[name]


def test_picture_and_prompt_reach_a_vision_language_model(qtbot, settings, llava):
    folder, img = llava
    w, st = _window(qtbot, settings, model=str(folder), image=str(img), text=PROMPT)
    _ready(qtbot, st, "image-text")
    r = st.result
    assert r.image_token_positions is not None and len(r.image_token_positions) == 16
    assert "<image r3c3>" in r.tokens and "".join(r.tokens).count("cat") == 1  # the prompt went in with the picture
    line = w.input_panel.current.text()
    assert "16 image tokens" in line and f"+ {r.num_tokens - 16} text tokens" in line, line
    # a new prompt runs again with the same picture, on the same model (no switch to a text model)
    st.set_text("USER: <image>\nwhere is the dog ASSISTANT:")
    qtbot.waitUntil(lambda: not st.busy and "".join(st.result.tokens).count("dog") == 1, timeout=60000)
    assert st.info.name == str(folder) and len(st.result.image_token_positions) == 16
    # the query starts on the prompt's last token, not on a patch
    assert st.query not in set(st.result.image_token_positions[:, 0].tolist())
    # back to a text model: text runs as before
    st.load_model("textbook", want_image=False)
    _ready(qtbot, st, "text")
    assert st.result.image_token_positions is None and "dog" in "".join(st.result.tokens)
    assert "Showing text" in w.input_panel.current.text()
    st.shutdown()


def test_overlay_draws_a_text_tokens_attention_on_the_picture(qtbot, settings, llava):
    from attn_explorer.api.vlm import image_overlay

    folder, img = llava
    w, st = _window(qtbot, settings, model=str(folder), image=str(img), text=PROMPT)
    _ready(qtbot, st, "image-text")
    assert w.current_page_name == "overlay"  # a vision-language model opens on the picture
    page = w.overlay
    r = st.result
    qtbot.waitUntil(lambda: page._vlm is not None and page.big_rgb is not None, timeout=30000)
    assert page.token_pick.isVisible() and page.average.isVisible()
    q = st.query
    got = page._vlm
    want = image_overlay(r, q, st.layer, st.head)
    assert got.query == q and np.allclose(got.picture, want.picture, atol=1e-7)
    assert got.heads.shape == (r.attentions.shape[1], 4, 4)
    assert "image tokens" in page.caption.text() and repr(r.tokens[q]) in page.caption.text()
    assert "random weights" in page.caption.text()  # a folder's weights are never called trained (issue 26 C)
    # the layer's heads averaged, then every layer and head
    for key, layer, head in (("layer", st.layer, None), ("all", None, None)):
        page.average.setCurrentIndex(page.average.findData(key))
        qtbot.waitUntil(lambda: page._vlm is not None and page._vlm.average == key, timeout=30000)
        assert np.allclose(page._vlm.picture, image_overlay(r, q, layer, head).picture, atol=1e-6)
    # choosing another text token in the list: its row is drawn
    images = set(r.image_token_positions[:, 0].tolist())
    other = next(i for i in range(r.num_tokens) if i not in images and i != q)
    page.token_pick.activated.emit(page.token_pick.findData(other))
    qtbot.waitUntil(lambda: page._vlm is not None and page._vlm.query == other, timeout=30000)
    assert np.allclose(page._vlm.picture, image_overlay(r, other, None, None).picture, atol=1e-6)
    # a click on a patch: that image token asks
    from PySide6.QtCore import Qt

    page.average.setCurrentIndex(page.average.findData("head"))
    pos = page.patch_center(1, 2)
    qtbot.mouseClick(page.canvas.viewport(), Qt.LeftButton, pos=page.canvas.mapFromScene(pos))
    at = int(r.image_token_positions[(r.image_token_positions[:, 2] == 1) & (r.image_token_positions[:, 3] == 2), 0][0])
    qtbot.waitUntil(lambda: st.query == at and page._vlm is not None and page._vlm.query == at, timeout=30000)
    st.shutdown()


def test_grid_and_one_head_pages_show_the_decoders_maps_with_image_labels(qtbot, settings, llava):
    folder, img = llava
    w, st = _window(qtbot, settings, model=str(folder), image=str(img), text=PROMPT)
    _ready(qtbot, st, "image-text")
    r = st.result
    # the run is read as tokens (the decoder's maps over image and text), not as an image model's patches (r.grid
    # is the tower's grid): the n panel, rollout and the head statistics would take the prompt's first tokens for
    # patches
    from attn_explorer.session.vlm import patch_grid_of

    assert r.grid is not None and patch_grid_of(r) is None and r.attentions.shape[2] == r.num_tokens
    assert not w.seq_panel._image_mode and "patches" not in w.seq_panel.title()
    # the cut to the first n tokens is not offered for a picture and a prompt: the slider says so, off
    assert not w.seq_panel.slider.isEnabled() and "vision-language" in w.seq_panel.slider.toolTip()
    w.show_page("head")
    qtbot.waitUntil(lambda: len(w.head_view.tokens) == r.num_tokens, timeout=30000)
    assert "<image r3c3>" in w.head_view.tokens and "<image r0c0>" in w.head_view.col_tokens
    w.show_page("grid")
    qtbot.waitUntil(lambda: st.grid_image is not None, timeout=30000)
    assert "16 image tokens (4×4 patches)" in w.input_panel.current.text()
    st.shutdown()


def test_overlay_on_tiles_and_a_global_view(qtbot, settings, tmp_path):
    """Idefics3: 2 × 2 tiles and a global view; the tiles are assembled on the picture, the global view's share
    is said in words."""
    from PIL import Image

    from attn_explorer.api.vlm import image_overlay

    (tmp_path / "idefics3").mkdir()
    make(tmp_path / "idefics3", "idefics3")
    img = tmp_path / "picture.png"
    Image.fromarray(picture()).save(img)
    w, st = _window(qtbot, settings, model=str(tmp_path / "idefics3"), image=str(img),
                    text="User:<image>the cat sat<end_of_utterance>\nAssistant:")
    _ready(qtbot, st, "image-text")
    page, r = w.overlay, st.result
    qtbot.waitUntil(lambda: page._vlm is not None and page.big_rgb is not None, timeout=30000)
    want = image_overlay(r, st.query, st.layer, st.head)
    assert page._vlm.picture.shape == want.picture.shape == (8, 8)  # 2 × 2 tiles of 4 × 4 patches (merges undone)
    assert np.allclose(page._vlm.picture, want.picture, atol=1e-7)
    assert "global view" in page.caption.text() and "2×2 tiles" in w.input_panel.current.text()
    st.shutdown()
