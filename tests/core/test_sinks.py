"""Learned attention sinks (gpt-oss, core.sinks): each head's sink logit joins every row's softmax and takes
its share. Held to transformers' own eager_attention_forward and GptOssAttention at module level, and the
explicit, fused and lazy paths held to each other."""
from __future__ import annotations

import pytest
import torch

from attn_explorer.core import lazy
from attn_explorer.core.attention import AttentionOptions, LayerKV, MultiHeadAttention, scaled_dot_product_attention
from attn_explorer.core.hooks import Hooks
from attn_explorer.core.masks import fold_mask
from attn_explorer.core.sinks import fold_sink, sink_share, softmax_with_sink

TOL = 1e-5


def _sinks(H, seed=5, spread=2.0):
    return torch.randn(H, generator=torch.Generator().manual_seed(seed)) * spread


def _qkv(B, H, H_kv, N, M, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, N, d, generator=g) * 1.5, torch.randn(B, H_kv, M, d, generator=g) * 1.5,
            torch.randn(B, H_kv, M, d, generator=g))


def test_softmax_with_sink_by_hand():
    """Logits 1, 2 and a sink of 0.5: p = e^1, e^2 over e^1 + e^2 + e^0.5; the rest is the sink's."""
    p = softmax_with_sink(torch.tensor([[[1.0, 2.0]]]), torch.tensor([0.5]))
    denom = torch.exp(torch.tensor(1.0)) + torch.exp(torch.tensor(2.0)) + torch.exp(torch.tensor(0.5))
    want = torch.exp(torch.tensor([1.0, 2.0])) / denom
    torch.testing.assert_close(p[0, 0], want)
    torch.testing.assert_close(1 - p.sum(), torch.exp(torch.tensor(0.5)) / denom)
    dead = softmax_with_sink(torch.full((1, 1, 3), float("-inf")), torch.tensor([0.0]))  # nothing to see
    assert torch.equal(dead, torch.zeros(1, 1, 3))  # the whole weight is the sink's, never NaN


def _hf_eager():
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    return gpt_oss


@pytest.mark.parametrize("window", [None, 5])
def test_the_explicit_path_is_transformers_eager(window):
    """transformers' eager_attention_forward (sink column, max subtracted, softmax in the logits' dtype) on
    the same q, k, v and its additive mask (finfo.min where hidden): maps and output within 1e-5."""
    gpt_oss = _hf_eager()
    B, H, H_kv, N, d = 2, 4, 2, 11, 8
    q, k, v = _qkv(B, H, H_kv, N, N, d)
    sinks = _sinks(H)
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups = torch.nn.Parameter(sinks.clone()), H // H_kv
    module.eval()
    pad = torch.ones(B, 1, 1, N, dtype=torch.bool)
    pad[1, ..., :3] = False  # left padding: batch row 1's first three keys
    seen = fold_mask(pad, True, N, N, window=window)
    additive = torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)
    scale = d ** -0.5
    with torch.no_grad():
        ref_out, ref_probs = gpt_oss.eager_attention_forward(module, q, k, v, additive, scaling=scale)
    rep = H // H_kv
    out, probs = scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                              mask=pad, causal=True, window=window, sinks=sinks)
    live = seen.expand(B, H, N, N).any(-1)  # rows that see a key (transformers' dead rows are not exactly 0)
    assert (probs - ref_probs).abs()[live].max() <= TOL
    assert (out.transpose(1, 2) - ref_out).abs().max() <= TOL
    share = 1 - probs.sum(-1)
    assert (share > 0).all() and (share[live] < 1).all()
    assert torch.equal(probs[~live], torch.zeros_like(probs[~live])) and (share[~live] == 1).all()


def _copy_attention(ours: MultiHeadAttention, theirs) -> None:
    with torch.no_grad():
        for a, b in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"), ("out", "o_proj")):
            getattr(ours, a).weight.copy_(getattr(theirs, b).weight)
            getattr(ours, a).bias.copy_(getattr(theirs, b).bias)
        ours.sinks.copy_(theirs.sinks)


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_multi_head_attention_equals_gpt_oss_attention(layer_type):
    """Our MultiHeadAttention(sinks=True) with GptOssAttention's weights (q, k, v and o biases, sinks): the
    same maps and output, with and without maps asked for (the fused path), RoPE left out (cos 1, sin 0)."""
    transformers = pytest.importorskip("transformers")
    gpt_oss = _hf_eager()
    cfg = transformers.GptOssConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    num_hidden_layers=2, sliding_window=4, layer_types=[layer_type] * 2,
                                    attn_implementation="eager")
    torch.manual_seed(0)
    theirs = gpt_oss.GptOssAttention(cfg, 0).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ours = MultiHeadAttention(32, 4, num_kv_heads=2, head_dim=8, sinks=True).eval()
    _copy_attention(ours, theirs)
    B, N = 2, 9
    x = torch.randn(B, N, 32)
    window = 4 if layer_type == "sliding_attention" else None
    seen = fold_mask(None, True, N, N, window=window)
    additive = torch.zeros(1, 1, N, N).masked_fill(~seen, torch.finfo(torch.float32).min)
    cos_sin = (torch.ones(B, N, 4), torch.zeros(B, N, 4))
    with torch.no_grad():
        ref, ref_probs = theirs(x, cos_sin, additive)
        out, probs = ours(x, AttentionOptions(causal=True, window=window, need_weights=True))
        fused, none = ours(x, AttentionOptions(causal=True, window=window))
    assert none is None
    assert (probs - ref_probs).abs().max() <= TOL and (out - ref).abs().max() <= TOL
    assert (fused - ref).abs().max() <= TOL


CASES = {
    # name: (B, H, H_kv, N, M, window, padded)
    "causal": (1, 4, 2, 40, 40, None, False),
    "causal padding": (2, 4, 2, 40, 40, None, True),
    "window": (1, 4, 1, 60, 60, 7, False),
    "window padding": (2, 4, 2, 30, 30, 5, True),
    "cache offset": (1, 4, 2, 6, 25, None, False),
    "window cache offset": (1, 2, 1, 9, 33, 6, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_and_lazy_equal_the_explicit_path(name):
    """The fused path (the sink folded into a kernel's output through its lse) and lazy attention (the kept
    lse includes the sink) agree with the explicit softmax; lazy tiles give the dense maps, and the sink's
    share from the lse is 1 - each row's sum."""
    B, H, H_kv, N, M, window, padded = CASES[name]
    q, k, v = _qkv(B, H, H_kv, N, M, 8, seed=2)
    sinks = _sinks(H, seed=9)
    mask = None
    if padded:
        mask = torch.ones(B, 1, 1, M, dtype=torch.bool)
        mask[1, ..., :4] = False
    o = AttentionOptions(mask=mask, causal=True, window=window, dk_scale=1.3)
    rep = H // H_kv
    out, probs = scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                              mask=mask, causal=True, window=window, dk_scale=1.3, sinks=sinks)
    kept, lse = fold_sink(*lazy.keep_attention(q, k, v, o, 8), sinks)
    assert not torch.isnan(kept).any() and torch.isfinite(lse).all()  # a row seeing no key still sees the sink
    assert (kept - out).abs().max() <= TOL
    torch.testing.assert_close(sink_share(lse, sinks), 1 - probs.sum(-1), atol=1e-6, rtol=0)
    lo = lazy.LayerOptions.of(o, 8, sinks=sinks)
    for b in range(B):
        for h in (0, H - 1):
            torch.testing.assert_close(lazy.head_probs(q, k, lse, lo, h, batch=b), probs[b, h], atol=1e-6, rtol=1e-6)
    blocked_out, blocked_lse = lazy._keep_blocked(q, lazy._rep(k, H), lazy._rep(v, H), lazy.LayerOptions.of(o, 8), 16)
    assert (fold_sink(blocked_out, blocked_lse, sinks)[0] - out).abs().max() <= TOL


def test_the_module_paths_agree_with_a_cache_and_keep_the_sinks():
    """MultiHeadAttention(sinks=True): explicit, fused and lazy outputs agree through a KV cache (N < M);
    the lazy keep stores the sinks beside q, k and an lse that includes them."""
    torch.manual_seed(3)
    mha = MultiHeadAttention(24, 4, num_kv_heads=2, head_dim=6, sinks=True).eval()
    with torch.no_grad():
        mha.sinks.copy_(_sinks(4))
    x = torch.randn(1, 12, 24)
    with torch.no_grad():
        full, probs = mha(x, AttentionOptions(causal=True, window=5, need_weights=True))
        kv = LayerKV()
        mha(x[:, :7], AttentionOptions(causal=True, window=5, kv=kv))
        step, _ = mha(x[:, 7:], AttentionOptions(causal=True, window=5, kv=kv))
        hooks = Hooks({}, keep=True)
        kept, none = mha(x, AttentionOptions(causal=True, window=5, hooks=hooks.layer(0)))
    assert none is None
    assert (step - full[:, 7:]).abs().max() <= TOL and (kept - full).abs().max() <= TOL
    layer = hooks.kept[0]
    assert torch.equal(layer.options.sinks, mha.sinks.detach())
    torch.testing.assert_close(sink_share(layer.lse, layer.options.sinks)[0], 1 - probs[0].sum(-1), atol=1e-6, rtol=0)


def test_autograd_reaches_the_sinks():
    """The explicit path under autograd (relevance methods): gradients flow to the sink logits."""
    mha = MultiHeadAttention(16, 2, sinks=True)
    out, probs = mha(torch.randn(1, 5, 16), AttentionOptions(causal=True, need_weights=True))
    out.sum().backward()
    assert mha.sinks.grad is not None and mha.sinks.grad.abs().sum() > 0
    assert (probs.sum(-1) < 1).all()
