"""core.lazy: the forward that keeps q, k and each row's lse, and the tiles computed again from them,
against the explicit attention (core.attention.scaled_dot_product_attention, itself held to transformers)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attn_explorer.core import lazy
from attn_explorer.core.attention import AttentionOptions, attention_scale, fold_mask, scaled_dot_product_attention
from attn_explorer.maths import pool2d

TOL = 1e-6  # maps and lse
# probabilities: 1e-6, plus 1e-6 relative near 1, where float32's own rounding of a logit of ~6 (5e-7) and
# of the lse shows up (the dense map is off by as much against float64)
RTOL = 1e-6
OUT_TOL = 1e-5  # layer outputs (sums of |v| ~ 2 values: float32 rounding of a different summation order)


def _qkv(B, H, H_kv, N, M, d, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, d, generator=g) * spread
    k = torch.randn(B, H_kv, M, d, generator=g) * spread
    v = torch.randn(B, H_kv, M, d, generator=g)
    return q, k, v


def _dense(q, k, v, o: AttentionOptions):
    """The explicit path's output, probabilities and the rows' logsumexp of the masked logits."""
    H = q.shape[1]
    kr, vr = lazy._rep(k, H), lazy._rep(v, H)
    out, probs = scaled_dot_product_attention(q, kr, vr, mask=o.mask, scale=o.scale, dk_scale=o.dk_scale,
                                              causal=o.causal, window=o.window, softcap=o.softcap)
    s = torch.matmul(q, kr.transpose(-2, -1)) * attention_scale(q.shape[-1], o.dk_scale, o.scale)
    if o.softcap is not None:
        s = torch.tanh(s / o.softcap) * o.softcap
    full = fold_mask(o.mask, o.causal, q.shape[-2], k.shape[-2], window=o.window)
    if full is not None:
        s = s.masked_fill(~full, float("-inf")) if full.dtype == torch.bool else s + full
    return out, probs, torch.logsumexp(s, dim=-1)


def _padding(B, M, pad):
    """bool (B, 1, 1, M): batch row 1 has its first `pad` keys padded (left padding)."""
    m = torch.ones(B, 1, 1, M, dtype=torch.bool)
    m[1, ..., :pad] = False
    return m


CASES = {
    # name: (B, H, H_kv, N, M, d, AttentionOptions kwargs)
    "encoder": (2, 3, 3, 37, 37, 8, {}),
    "encoder padding": (2, 3, 3, 37, 37, 8, {"mask": "pad"}),
    "encoder all padded": (2, 2, 2, 9, 9, 8, {"mask": "allpad"}),
    "causal": (1, 4, 4, 50, 50, 8, {"causal": True}),
    "causal padding (dead rows)": (2, 4, 2, 50, 50, 8, {"causal": True, "mask": "pad"}),
    "causal cache offset": (1, 4, 2, 7, 30, 8, {"causal": True}),
    "more queries than keys": (1, 2, 2, 12, 5, 8, {"causal": True}),
    "window": (1, 4, 1, 200, 200, 8, {"causal": True, "window": 17}),
    "window padding": (2, 4, 2, 90, 90, 8, {"causal": True, "window": 9, "mask": "pad"}),
    "window cache offset": (1, 2, 1, 20, 64, 8, {"causal": True, "window": 11}),
    "softcap": (1, 4, 2, 60, 60, 8, {"causal": True, "softcap": 0.9}),
    "softcap window": (1, 4, 2, 60, 60, 8, {"causal": True, "softcap": 0.9, "window": 7}),
    "dk slider and scale": (1, 4, 2, 45, 45, 16, {"causal": True, "dk_scale": 2.7, "scale": 0.06}),
    "additive per-row mask": (1, 2, 2, 30, 30, 8, {"mask": "rows"}),
}


def _opts(kw, B, N, M):
    kw = dict(kw)
    if kw.get("mask") == "pad":
        kw["mask"] = _padding(B, M, 13)
    elif kw.get("mask") == "allpad":
        kw["mask"] = _padding(B, M, M)
    elif kw.get("mask") == "rows":
        g = torch.Generator().manual_seed(3)
        kw["mask"] = torch.where(torch.rand(1, 1, N, M, generator=g) < 0.3, float("-inf"), 0.0)
        kw["mask"][..., 4, :] = float("-inf")  # one row sees nothing
    return AttentionOptions(**kw)


@pytest.mark.parametrize("name", list(CASES))
def test_keep_attention_matches_the_explicit_path(name):
    B, H, H_kv, N, M, d, kw = CASES[name]
    q, k, v = _qkv(B, H, H_kv, N, M, d, spread=1.5)
    o = _opts(kw, B, N, M)
    out, probs, lse = _dense(q, k, v, o)
    ours, our_lse = lazy.keep_attention(q, k, v, o, d)
    assert not torch.isnan(ours).any() and not torch.isnan(our_lse).any()
    torch.testing.assert_close(ours, out, atol=OUT_TOL, rtol=0)
    dead = torch.isneginf(lse)
    assert torch.equal(torch.isneginf(our_lse), dead)  # a row with no key: -inf, never NaN or 0
    torch.testing.assert_close(our_lse[~dead], lse[~dead], atol=TOL, rtol=0)
    # the blocked path (soft-capping, autograd, GPUs) agrees with the fused one
    blocked_out, blocked_lse = lazy._keep_blocked(q, lazy._rep(k, H), lazy._rep(v, H), lazy.LayerOptions.of(o, d), 16)
    torch.testing.assert_close(blocked_out, out, atol=OUT_TOL, rtol=0)
    assert torch.equal(torch.isneginf(blocked_lse), dead)
    torch.testing.assert_close(blocked_lse[~dead], lse[~dead], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", list(CASES))
def test_tiles_equal_the_dense_maps(name):
    B, H, H_kv, N, M, d, kw = CASES[name]
    q, k, v = _qkv(B, H, H_kv, N, M, d, seed=1)  # logits ~ N(0, 1): float32 rounds them to ~1e-7
    o = _opts(kw, B, N, M)
    _, probs, _ = _dense(q, k, v, o)
    _, lse = lazy.keep_attention(q, k, v, o, d)
    lo = lazy.LayerOptions.of(o, d)
    for b in range(B):
        for h in (0, H - 1):
            want = probs[b, h]
            torch.testing.assert_close(lazy.head_probs(q, k, lse, lo, h, batch=b), want, atol=TOL, rtol=RTOL)
            r, c = (N // 3, N - 2), (M // 4, M // 4 + 9)
            torch.testing.assert_close(lazy.head_probs(q, k, lse, lo, h, r, c, batch=b),
                                       want[r[0]:r[1], c[0]:c[1]], atol=TOL, rtol=RTOL)
            torch.testing.assert_close(lazy.head_row(q, k, lse, lo, h, N - 3, batch=b), want[N - 3], atol=TOL, rtol=RTOL)
            torch.testing.assert_close(lazy.head_col(q, k, lse, lo, h, 2, batch=b), want[:, 2], atol=TOL, rtol=RTOL)
            for cells, reduce in (((7, 5), "max"), ((4, 6), "mean"), (1000, "max")):
                got = lazy.head_pooled(q, k, lse, lo, h, cells, reduce, batch=b, tile=600).numpy()  # several tiles
                cr, cc = (cells, cells) if isinstance(cells, int) else cells
                np.testing.assert_allclose(got, pool2d(want.numpy(), cr, cc, reduce), atol=TOL, rtol=RTOL)


def test_long_window_and_global_layers_at_2048():
    """n = 2,048 with a 512-key window (Gemma 3's local layers), GQA 2:1 and head size 64; and a global layer."""
    q, k, v = _qkv(1, 2, 1, 2048, 2048, 64, seed=2)
    for kw in ({"causal": True, "window": 512, "scale": 0.1}, {"causal": True, "dk_scale": 0.5}):
        o = AttentionOptions(**kw)
        out, probs, lse = _dense(q, k, v, o)
        ours, our_lse = lazy.keep_attention(q, k, v, o, 64)
        torch.testing.assert_close(ours, out, atol=OUT_TOL, rtol=0)
        torch.testing.assert_close(our_lse, lse, atol=TOL, rtol=0)
        lo = lazy.LayerOptions.of(o, 64)
        for h in (0, 1):
            got = lazy.head_pooled(q, k, our_lse, lo, h, 300, "max").numpy()
            np.testing.assert_allclose(got, pool2d(probs[0, h].numpy(), 300, 300, "max"), atol=TOL, rtol=RTOL)
            win = lazy.head_probs(q, k, our_lse, lo, h, (1500, 1756), (1200, 1456))
            torch.testing.assert_close(win, probs[0, h, 1500:1756, 1200:1456], atol=TOL, rtol=RTOL)


def test_the_window_keeps_nothing_out_of_its_band(monkeypatch):
    """A windowed layer's pooled map: cells wholly outside the band are exactly 0 (never computed)."""
    q, k, v = _qkv(1, 2, 2, 400, 400, 8, seed=4)
    o = AttentionOptions(causal=True, window=20)
    _, lse = lazy.keep_attention(q, k, v, o, 8)
    calls = []
    real = lazy._Head.log_probs
    monkeypatch.setattr(lazy._Head, "log_probs", lambda self, r, c: calls.append((r, c)) or real(self, r, c))
    got = lazy.head_pooled(q, k, lse, lazy.LayerOptions.of(o, 8), 1, 40, "max", tile=400).numpy()  # 10 x 10 tokens a cell
    i, j = np.indices(got.shape)
    assert (got[(j > i) | (j < i - 3)] == 0).all() and (got[j == i] > 0).all()
    assert 0 < len(calls) and sum((r.stop - r.start) * (c.stop - c.start) for r, c in calls) < 400 * 400 / 4


def test_max_pool_finds_a_planted_spike():
    N, d = 3000, 16
    q, k, v = _qkv(1, 1, 1, N, N, d, seed=5, spread=0.02)  # nearly uniform rows
    i, j = 1234, 2777
    q[0, 0, i, 0] = k[0, 0, j, 0] = 40.0  # one query reads one key: weight ~1 there, ~1/N elsewhere
    o = AttentionOptions()
    _, lse = lazy.keep_attention(q, k, v, o, d)
    got = lazy.head_pooled(q, k, lse, lazy.LayerOptions.of(o, d), 0, 64, "max").numpy()
    re, ce = np.arange(65) * N // 64, np.arange(65) * N // 64
    cell = (np.searchsorted(re, i, side="right") - 1, np.searchsorted(ce, j, side="right") - 1)
    assert np.unravel_index(got.argmax(), got.shape) == cell and got[cell] > 0.99
    assert np.sort(got.ravel())[-2] < 0.01


def test_mean_pool_conserves_each_rows_mass():
    """Σ over a row of cells of mean × cell width = 1: each query's weights sum to 1, pooled or not."""
    q, k, v = _qkv(1, 2, 1, 1001, 1001, 8, seed=6, spread=1.5)
    for o in (AttentionOptions(causal=True), AttentionOptions(causal=True, window=50), AttentionOptions()):
        _, lse = lazy.keep_attention(q, k, v, o, 8)
        got = lazy.head_pooled(q, k, lse, lazy.LayerOptions.of(o, 8), 1, (37, 23), "mean").numpy().astype(np.float64)
        widths = np.diff(np.arange(24) * 1001 // 23)
        np.testing.assert_allclose(got @ widths, 1.0, atol=1e-6)


def test_progress_and_stop():
    q, k, v = _qkv(1, 1, 1, 256, 256, 8, seed=7)
    o = AttentionOptions(causal=True)
    _, lse = lazy.keep_attention(q, k, v, o, 8)
    lo, seen = lazy.LayerOptions.of(o, 8), []
    lazy.head_pooled(q, k, lse, lo, 0, 64, progress=lambda done, total: seen.append((done, total)), tile=1024)
    assert seen and seen[-1][0] == seen[-1][1] and [s[0] for s in seen] == list(range(1, len(seen) + 1))
    with pytest.raises(lazy.Stopped):
        lazy.head_pooled(q, k, lse, lo, 0, 64, stop=lambda: True)


def test_keep_hooks_hold_q_k_lse_and_options():
    """MultiHeadAttention's keep branch: q (B, H, N, d), k before GQA repetition, lse, options; no maps."""
    from attn_explorer.core.attention import MultiHeadAttention
    from attn_explorer.core.hooks import Hooks

    torch.manual_seed(0)
    m = MultiHeadAttention(24, 6, num_kv_heads=2).eval()
    x = torch.randn(1, 33, 24)
    hooks = Hooks(keep=True)
    o = AttentionOptions(causal=True, window=8, dk_scale=1.5)
    with torch.inference_mode():
        out, probs = m(x, AttentionOptions(**{**o.__dict__, "hooks": hooks.layer(0)}))
        ref, want = m(x, AttentionOptions(**{**o.__dict__, "need_weights": True}))
    kept = hooks.kept[0]
    assert probs is None and kept.q.shape == (1, 6, 33, 4) and kept.k.shape == (1, 2, 33, 4)
    assert kept.lse.shape == (1, 6, 33)
    torch.testing.assert_close(out, ref, atol=OUT_TOL, rtol=0)
    got = lazy.head_probs(kept.q, kept.k, kept.lse, kept.options, 5)
    torch.testing.assert_close(got, want[0, 5], atol=TOL, rtol=RTOL)


def test_a_kept_layer_refuses_to_return_maps_it_never_computed():
    """keep fills no probability buffer: asking for the maps as well must fail, not return uninitialised memory."""
    from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
    from attn_explorer.core.hooks import Hooks

    torch.manual_seed(0)
    stack = BlockStack([TransformerBlock(BlockConfig(16, 2, 32), i) for i in range(2)]).eval()
    x = torch.randn(1, 5, 16)
    with torch.inference_mode():
        _, maps = stack(x, output_attentions=True)
        assert maps.shape == (1, 2, 2, 5, 5)
        with pytest.raises(ValueError, match="layer 0 keeps q, k and lse"):
            stack(x, output_attentions=True, hooks=Hooks(keep=True))
        hooks = Hooks(keep=True)
        out, none = stack(x, hooks=hooks)
        assert sorted(hooks.kept) == [0, 1]
        assert none is None and out.shape == x.shape


def test_bf16_tiles_take_one_bf16_product_within_the_stated_error(monkeypatch):
    """Issue 24 E: a bfloat16 layer's tiles are one bfloat16 product (core.tiles) with lse carried in two
    bfloat16 parts: within 2^-8 / e of the float32 probabilities (core.bf16's bound), rows still summing to 1."""
    from attn_explorer.core import tiles

    monkeypatch.setattr(lazy, "native_bf16", lambda: True)  # the bf16 branch on any CPU (slower, same numbers)
    calls = []
    real = tiles.Bf16Tiles.logits
    monkeypatch.setattr(tiles.Bf16Tiles, "logits", lambda self, *a: calls.append(1) or real(self, *a))
    torch.manual_seed(0)
    n, d = 300, 64
    q, k = (torch.randn(1, 2, n, d) * 2).bfloat16(), (torch.randn(1, 1, n, d) * 2).bfloat16()
    s = (q.float()[0] @ k.float()[0].transpose(-1, -2)) / 8
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    lse = torch.logsumexp(s, -1)[None]
    o = lazy.LayerOptions(causal=True, scale=1 / 8)
    for head in (0, 1):
        got = lazy.head_probs(q, k, lse, o, head)
        want = torch.softmax(s[head], -1)
        assert (got - want).abs().max().item() <= 2 ** -8 / math.e
        assert got.triu(1).abs().max().item() == 0
    assert calls
    pooled = lazy.head_pooled(q, k, lse, o, 0, 50, reduce="mean")
    assert (pooled * 6).sum(-1).sub(1).abs().max().item() < 2e-3  # 6 keys a cell: each row's mean · 6 sums to 1


@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("cells", [50, 7])
def test_bf16_max_pool_is_the_pooled_max_of_its_probabilities(window, cells, monkeypatch):
    """Issue 24 E: a bfloat16 head's max-pooled view takes each cell's max over the tile's bfloat16 products and
    scales after (core.tiles), in tiles split at the diagonal; each cell is the max of the head's probabilities
    over it (head_probs), within bfloat16's stated error, and exactly 0 where the triangle or window hides it."""
    from attn_explorer.core.pool_cells import pool_edges

    monkeypatch.setattr(lazy, "native_bf16", lambda: True)
    torch.manual_seed(1)
    n, d = 300, 64
    q, k = (torch.randn(1, 1, n, d) * 2).bfloat16(), (torch.randn(1, 1, n, d) * 2).bfloat16()
    o = lazy.LayerOptions(causal=True, scale=1 / 8, window=window)
    s = (q.float()[0, 0] @ k.float()[0, 0].T) / 8
    lse = torch.logsumexp(s.masked_fill(lazy._hidden(slice(0, n), slice(0, n), n, n, window, None), -math.inf), -1)
    full = lazy.head_probs(q, k, lse[None, None], o, 0)
    got = lazy.head_pooled(q, k, lse[None, None], o, 0, cells, reduce="max", tile=48 * 64)  # many small tiles
    edges = pool_edges(n, cells).tolist()
    want = torch.tensor([[full[a:b, c:e].max().item() for c, e in zip(edges, edges[1:])]
                         for a, b in zip(edges, edges[1:])])
    assert (got - want).abs().max().item() <= 2 ** -8 / math.e
    assert torch.equal(got == 0, want == 0)
