"""RunResult.to_bertviz(): what bertviz's head_view and model_view take, checked against bertviz itself."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from tests.analysis.conftest import SENTENCES

HAS_BERTVIZ = importlib.util.find_spec("bertviz") is not None


def test_to_bertviz_gives_one_1_h_n_n_tensor_per_layer(minilm):
    r = minilm.run(SENTENCES[0])
    attention, tokens = r.to_bertviz()
    assert isinstance(attention, tuple) and len(attention) == 6 and tokens == r.tokens
    for l, a in enumerate(attention):
        assert isinstance(a, torch.Tensor) and tuple(a.size()) == (1, 12, 16, 16) and a.dtype == torch.float32
        np.testing.assert_array_equal(a[0].numpy(), r.attentions[l])
    attention[0][0, 0, 0, 0] = 5.0  # a copy: bertviz (or the user) may change it freely
    assert r.attentions[0, 0, 0, 0] != 5.0


@pytest.mark.skipif(not HAS_BERTVIZ, reason="bertviz is not installed (pip install bertviz)")
def test_bertviz_head_view_and_model_view_accept_it(minilm):
    from bertviz import head_view, model_view

    attention, tokens = minilm.run("Zebras graze quietly near the riverbank.").to_bertviz()
    for view in (head_view, model_view):
        html = view(attention, tokens, html_action="return").data
        words = [t for t in tokens if not t.startswith("##")]
        assert "zebra" in words and "quietly" in words  # whole words, as bertviz shows them
        for t in words:
            assert f'"{t}"' in html, (view.__name__, t)
