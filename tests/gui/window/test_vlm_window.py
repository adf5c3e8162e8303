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


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llava")
    make(folder, "llava")
    from PIL import Image

    img = folder / "picture.png"
    Image.fromarray(picture()).save(img)
    return folder, img


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
