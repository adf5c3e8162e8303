"""Value-weighted norms: the formula on hand-built heads, and on a real model's own W_V and W_O."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from attn_explorer.analysis.norms import (model_norms, out_projections, special_share, transformed_value_norms,
                                          value_weighted_norms)
from attn_explorer.api.hooks import heads_first
from attn_explorer.errors import UserError
from tests.analysis.conftest import SENTENCES


def random_head_parts(H=3, N=5, d=4, D=8, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.random((H, N, N))
    return a / a.sum(-1, keepdims=True), rng.normal(size=(H, N, d)), rng.normal(size=(D, H, d))


def test_norms_are_the_length_of_alpha_times_w_o_v():
    a, v, w = random_head_parts()
    got = value_weighted_norms(a, v, w)
    H, N, _ = a.shape
    want = np.empty((H, N, N))
    for h in range(H):
        for i in range(N):
            for j in range(N):
                want[h, i, j] = np.linalg.norm(a[h, i, j] * (w[:, h, :] @ v[h, j]))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_head_with_zero_values_has_zero_norms():
    a, v, w = random_head_parts()
    v[1] = 0
    n = value_weighted_norms(a, v, w)
    assert not np.any(n[1]) and np.all(n[0] > 0) and np.all(n[2] > 0)
    assert not np.any(transformed_value_norms(v, w)[1])


def test_shapes_that_do_not_fit_are_one_line():
    a, v, w = random_head_parts()
    with pytest.raises(UserError, match="do not fit"):
        value_weighted_norms(a, v, w[:, :2])
    with pytest.raises(UserError, match="does not match"):
        value_weighted_norms(a[:, :4, :4], v, w)


def test_model_norms_match_the_forward_pass(minilm):
    text = SENTENCES[0]
    r = minilm.run(text)
    d = model_norms(minilm, text, layers=[0, 3])
    assert d.layers == [0, 3] and d.tokens == r.tokens and d.norms.shape == (2, 12, 16, 16)
    np.testing.assert_allclose(d.attentions, r.attentions[[0, 3]], atol=1e-6)
    # ‖f_h(x_j)‖ again, the slow way: the layer's own value projection and W_O slice on its input
    t = minilm.trace(minilm.prepare(text), names=["blocks.3.attn.hook_v", "blocks.3.attn.hook_z"])
    mha = out_projections(minilm.module)[3]
    w_o = mha.out.weight.view(-1, mha.num_heads, mha.head_dim)
    values = heads_first(t.cache["blocks.3.attn.hook_v"], mha.num_heads)[0]  # (H, N, d)
    z = heads_first(t.cache["blocks.3.attn.hook_z"], mha.num_heads)[0]  # (H, N, d): before W_O
    with torch.inference_mode():
        fx = torch.einsum("hnd,ehd->hne", values, w_o).norm(dim=-1).numpy()
        head_outputs = torch.einsum("hnd,ehd->hne", z, w_o)  # (H, N, D): each head's output after W_O
    np.testing.assert_allclose(d.value_norms[1], fx, rtol=1e-4)
    np.testing.assert_allclose(d.norms[1], d.attentions[1] * fx[:, None, :], rtol=1e-4, atol=1e-6)
    # the head's output is the sum of the vectors whose lengths these are
    out = head_outputs.norm(dim=-1).numpy()  # (H, N)
    assert np.all(out <= d.norms[1].sum(-1) + 1e-4)


def test_zeroing_a_heads_value_projection_zeroes_its_norms(minilm):
    m = copy.deepcopy(minilm)
    mha = out_projections(m.module)[2]
    h, dk = 5, mha.head_dim
    with torch.no_grad():
        mha.value.weight[h * dk:(h + 1) * dk] = 0
        mha.value.bias[h * dk:(h + 1) * dk] = 0
    if hasattr(mha, "packed_qkv"):
        mha.packed_qkv.clear()  # the fast path packs the three projections once
    d = model_norms(m, SENTENCES[1], layers=[2])
    assert not np.any(d.norms[0, h]) and np.all(d.norms[0, h - 1].sum(-1) > 0)
    assert d.attentions[0, h].sum() == pytest.approx(d.attentions.shape[-1], rel=1e-4)  # the weights are still there


def test_raw_weights_on_special_tokens_carry_little(minilm):
    """Measured on MiniLM: about half the raw weight sits on [CLS]/[SEP]; about a tenth of the norm does."""
    for text in SENTENCES[:3]:
        d = model_norms(minilm, text)
        raw = np.mean([special_share(d.attentions[l, h], d.special) for l in range(6) for h in range(12)])
        norm = np.mean([special_share(d.norms[l, h], d.special) for l in range(6) for h in range(12)])
        assert raw > 0.4 and norm < 0.2 and norm < raw / 3, (raw, norm)


def test_image_model_norms_have_patch_tokens():
    import attn_explorer as ax
    from PIL import Image

    m = ax.load_model("textbook-vit", device="cpu")
    img = Image.fromarray((np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8))
    d = model_norms(m, img)
    r = m.run(img)
    assert d.tokens == r.tokens and d.special[0] and d.norms.shape == r.attentions.shape


def test_bad_layers_are_one_line(minilm):
    with pytest.raises(UserError, match="layer 6 does not exist"):
        model_norms(minilm, "hello", layers=[6])
    with pytest.raises(UserError, match="do not take 'hidden'"):
        model_norms(minilm, "hello", hidden=True)
