"""Why a head looks there: the writer × writer matrix sums to the cell's real logit (RoPE, grouped-query heads,
Gemma's q/k and sandwich norms, GPT-2's LayerNorm and biases), and a silent writer gets an empty row and column."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_explorer.analysis import why
from attn_explorer.errors import UserError
from tests.analysis.test_lens import IDS, decoders  # noqa: F401 - the fixture


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_matrix_sums_to_the_cells_logit(decoders, family):  # noqa: F811
    m = decoders(family)
    for layer, head, i, j in ((2, 1, 9, 4), (1, 3, 6, 6), (0, 0, 5, 0)):
        w = why.why_matrix(m, IDS, None, layer, head, i, j)
        K = len(w.writers)
        assert w.matrix.shape == (K, K)
        assert abs(w.total - w.logit) < 1e-4, (family, layer, w.total, w.logit)
        assert K == (2 if family == "gpt2" else 1) + layer * (m.info.num_heads + 1) + 1
        assert abs(w.logit) > 1e-3


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_real_logit_is_the_models(decoders, family):  # noqa: F811
    """The cell's logit is the one the model softmaxes: its softmax over the keys is the model's attention row
    (Gemma 3's own attention scale; layer 2 is its global layer)."""
    m = decoders(family)
    i, layer, head = 7, 2, 3
    logits = np.array([why.why_matrix(m, IDS, None, layer, head, i, j).logit for j in range(i + 1)])
    p = np.exp(logits - logits.max())
    with torch.inference_mode():
        att = m.module(input_ids=torch.tensor([IDS]), output_attentions=True).attentions[0, layer, head, i, :i + 1]
    np.testing.assert_allclose(p / p.sum(), att.numpy(), atol=1e-5)


def test_a_silent_head_writes_nothing(decoders):  # noqa: F811
    m = decoders("gpt2")
    attn = m.module.blocks.layers[0].attn
    d = attn.head_dim
    saved = attn.out.weight.detach().clone()
    try:
        with torch.no_grad():
            attn.out.weight[:, 2 * d:3 * d] = 0
        w = why.why_matrix(m, IDS, None, 2, 0, 8, 3)
    finally:
        with torch.no_grad():
            attn.out.weight.copy_(saved)
    k = w.writers.index("L0 H2")
    assert w.heads[k] == (0, 2)
    assert np.all(w.matrix[k] == 0) and np.all(w.matrix[:, k] == 0)
    assert np.abs(w.matrix).max() > 1e-3 and abs(w.total - w.logit) < 1e-4


def test_condensed_keeps_the_sum(decoders):  # noqa: F811
    w = why.why_matrix(decoders("llama"), IDS, None, 2, 1, 9, 4)
    names, heads, mat = w.condensed(4)
    assert len(names) == 5 and mat.shape == (5, 5) and names[-1].startswith("all others")
    assert abs(mat.sum() - w.total) < 1e-9
    full_weight = np.maximum(np.abs(w.matrix.sum(1)), np.abs(w.matrix.sum(0)))
    assert w.writers[int(np.argmax(full_weight))] in names


@pytest.mark.parametrize("args,match", [((3, 0, 5, 1), "layer 3"), ((0, 9, 5, 1), "head 9"),
                                        ((0, 0, 3, 5), "comes after"), ((0, 0, 30, 1), "query 30")])
def test_bad_cells(decoders, args, match):  # noqa: F811
    with pytest.raises(UserError, match=match):
        why.why_matrix(decoders("llama"), IDS, None, *args)
