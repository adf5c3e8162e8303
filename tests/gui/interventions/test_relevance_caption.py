"""The Relevance page's description follows the loaded model: Gemma 2's logit soft-cap is named only for a
model that has one."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")

from tests.tiny_llama import make_llama_folder  # noqa: E402


def test_the_soft_cap_is_named_only_for_a_model_that_has_one(make_window, qtbot, tmp_path):
    w = make_window(model=str(make_llama_folder(tmp_path / "llama")), text="The capital of France is")
    page = w.pages["relevance"]
    d = SimpleNamespace(method="attnlrp", rows=[4], value=1.0, target="log p(' Paris')", scores=np.ones(5),
                        patch_offset=0)
    assert w.state.info.family != "gemma2"
    caption = page._caption(d, False)
    assert "AttnLRP" in caption or "uniform rule" in caption
    assert "soft-cap" not in caption and "Gemma" not in caption  # a Llama has no soft-cap to speak of
    import dataclasses

    gemma2 = dataclasses.replace(w.state.info, family="gemma2")  # as if Gemma 2 were loaded
    page.state = SimpleNamespace(info=gemma2, log_scale=False, hide_special=False)
    assert "soft-cap" in page._caption(d, False)
