"""Issue 26 B, relevance and ablation in the window on a vision-language model (a tiny random LLaVA built by
tests/hub/test_parity_vlm): the relevance page explains the picture and the prompt together and draws rel.picture
over the picture; a method that refuses (AttnLRP on Qwen3-VL) is one banner line; the Switch-off page's
comparison and scan run on the pair (image, text), equal to analysis.interventions called on it."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from attn_explorer.gui.widgets.overlay import blend  # noqa: E402
from tests.gui.window.test_vlm_window import PROMPT, _page, _ready, _window, llava  # noqa: E402,F401


def test_relevance_is_drawn_on_the_picture(qtbot, settings, llava):
    import attn_explorer as ax
    from attn_explorer.analysis.relevance import explain

    folder, w, st, page = _page(qtbot, settings, llava, "relevance")
    page.refresh()
    qtbot.waitUntil(lambda: page.data is not None, timeout=60000)
    d = page.data
    assert d.picture is not None and d.picture.shape == (4, 4) and len(d.scores) == st.result.num_tokens
    assert page.picture.isVisible() and not page.bars_plot.isVisible()
    want = explain(ax.load_model(str(folder), device="cpu"), (st.image, PROMPT), "gradient_rollout")
    assert d.tokens == want.tokens and np.allclose(d.picture, want.picture, atol=1e-6)  # the prompt went in too
    heat = np.clip(d.picture, 0, None)
    assert np.array_equal(page.picture_img.image, blend(d.image, heat, st.alpha, st.colormap, log=False))
    assert "image token" in page.caption.text() and "random weights" in page.caption.text()
    st.shutdown()


def test_ablation_runs_on_the_picture_and_the_prompt(qtbot, settings, llava):
    import attn_explorer as ax
    from attn_explorer.analysis.interventions import compare
    from attn_explorer.gui.interventions.ablation import TOP_TOKENS

    folder, w, st, page = _page(qtbot, settings, llava, "ablation")
    qtbot.waitUntil(lambda: page.comparison is not None, timeout=60000)
    with qtbot.waitSignal(page.compared, timeout=60000):
        page.toggle(0, 1)
    c = page.comparison
    want = compare(ax.load_model(str(folder), device="cpu"), (st.image, PROMPT), {(0, 1): "zero"}, top=TOP_TOKENS)
    assert c.heads == 1 and c.tokens == want.tokens and c.labels == want.labels and len(c.tokens) == st.result.num_tokens
    assert np.allclose(c.after, want.after, atol=1e-5) and not np.allclose(c.before, c.after)
    with qtbot.waitSignal(page.scan_finished, timeout=120000) as done:
        assert page.run_scan()
    assert not page.scan_kind.model().item(1).isEnabled()  # patching takes a second text: not offered here
    assert done.args == [True] and page.scan.values.shape == (st.info.num_layers, st.info.num_heads)
    st.shutdown()


def test_a_method_that_refuses_is_one_banner_line(qtbot, settings, tmp_path):
    from PIL import Image

    from tests.api.vlm_tiny import qwen3_vl_folder
    from tests.hub.test_parity_qwen_vl import picture

    qwen3_vl_folder(tmp_path)
    img = tmp_path / "picture.png"
    Image.fromarray(picture(24, 40)).save(img)
    w, st = _window(qtbot, settings, model=str(tmp_path), image=str(img), text="the cat <image> sat on")
    _ready(qtbot, st, "image-text")
    w.show_page("relevance")
    page = w.pages["relevance"]
    page.refresh()
    qtbot.waitUntil(lambda: page.data is not None, timeout=60000)  # gradient rollout is offered
    assert page.data.picture is not None and page.picture.isVisible()
    with qtbot.waitSignal(st.error_raised, timeout=60000) as err:
        page.method.setCurrentIndex(page.method.findData("attnlrp"))
    line = err.args[0]
    assert "AttnLRP is not offered" in line and "DeepStack" in line and "\n" not in line
    assert page.data is None and page.caption.text() == ""  # nothing of the last method is left as if it were this one
    st.shutdown()
