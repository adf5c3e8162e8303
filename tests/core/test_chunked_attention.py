"""Llama 4's chunked local attention (attention_chunk_size): a query sees only the keys of its own chunk,
causally; the chunks count from position 0, also when a KV cache holds the earlier positions."""
from __future__ import annotations

import pytest
import torch

from attn_explorer.core.attention import AttentionOptions
from attn_explorer.core.masks import causal_mask, chunk_start, fold_mask


def brute(n: int, m: int, chunk: int) -> torch.Tensor:
    out = torch.zeros(n, m, dtype=torch.bool)
    for i in range(n):
        p = i + m - n
        for j in range(m):
            out[i, j] = j <= p and j // chunk == p // chunk
    return out


@pytest.mark.parametrize("n,m,chunk", [(11, 11, 4), (1, 9, 4), (3, 13, 5), (8, 8, 8), (7, 7, 1), (5, 12, 3)])
def test_the_chunked_mask_is_each_querys_own_chunk(n, m, chunk):
    assert torch.equal(causal_mask(n, m, chunk=chunk), brute(n, m, chunk))
    assert chunk_start(m - 1, chunk) == (m - 1) // chunk * chunk and chunk_start(m - 1, None) == 0


def test_a_chunk_folds_into_a_padding_mask_and_needs_causal():
    pad = torch.tensor([[True] * 6 + [False] * 3])[:, None, None, :]
    full = fold_mask(pad, True, 9, 9, chunk=4)
    assert torch.equal(full[0, 0], brute(9, 9, 4) & pad[0, 0])
    add = torch.zeros(1, 1, 1, 9).masked_fill(~pad, float("-inf"))
    assert torch.equal(torch.isfinite(fold_mask(add, True, 9, 9, chunk=4))[0, 0], full[0, 0])
    with pytest.raises(ValueError, match="causal"):
        fold_mask(None, False, 9, 9, chunk=4)


# ---- the explicit, fused and lazy paths ----------------------------------------------------------------

import numpy as np  # noqa: E402

from attn_explorer.core import lazy  # noqa: E402
from attn_explorer.core.attention import fused_attention, scaled_dot_product_attention  # noqa: E402
from attn_explorer.maths import pool2d  # noqa: E402

PATHS = {
    # name: (B, H, H_kv, N, M, chunk, padding)
    "chunks of 8": (1, 4, 2, 50, 50, 8, False),
    "past a cache": (1, 4, 2, 7, 30, 8, False),
    "one new token": (1, 2, 1, 1, 19, 6, False),
    "padding": (2, 2, 2, 40, 40, 8, True),
    "one chunk": (1, 2, 2, 20, 20, 64, False),
    "chunk 1": (1, 2, 2, 12, 12, 1, False),
    "long": (1, 2, 1, 1500, 1500, 300, False),
}


def _case(name, seed=0):
    B, H, H_kv, N, M, chunk, pad = PATHS[name]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, n, 8, generator=g) for h, n in ((H, N), (H_kv, M), (H_kv, M)))
    mask = None
    if pad:
        mask = torch.ones(B, 1, 1, M, dtype=torch.bool)
        mask[1, ..., :11] = False
    return q, k, v, mask, chunk


def _reference(q, k, v, mask, chunk):
    """Plain softmax attention under the brute-force chunked mask: (output, probs, lse)."""
    H, N, M = q.shape[1], q.shape[2], k.shape[2]
    kr, vr = lazy._rep(k, H), lazy._rep(v, H)
    allowed = brute(N, M, chunk) if mask is None else brute(N, M, chunk) & mask
    s = (q @ kr.transpose(-2, -1) / 8 ** 0.5).masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ vr, p, lse


@pytest.mark.parametrize("name", list(PATHS))
def test_explicit_fused_and_lazy_paths_see_only_their_chunk(name):
    q, k, v, mask, chunk = _case(name)
    out, probs, lse = _reference(q, k, v, mask, chunk)
    H = q.shape[1]
    kr, vr = lazy._rep(k, H), lazy._rep(v, H)
    ours, p = scaled_dot_product_attention(q, kr, vr, mask=mask, causal=True, chunk=chunk)
    torch.testing.assert_close(p, probs, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours, out, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused_attention(q, kr, vr, mask, 8 ** -0.5, True, chunk=chunk), out, atol=1e-5, rtol=0)
    o = AttentionOptions(mask=mask, causal=True, chunk=chunk)
    lo = lazy.LayerOptions.of(o, 8)
    assert lo.chunk == chunk
    for kept, kept_lse in (lazy.keep_attention(q, k, v, o, 8), lazy._keep_blocked(q, kr, vr, lo, 16)):
        torch.testing.assert_close(kept, out, atol=1e-5, rtol=0)
        dead = torch.isneginf(lse)
        assert torch.equal(torch.isneginf(kept_lse), dead)
        torch.testing.assert_close(kept_lse[~dead], lse[~dead], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", [n for n in PATHS if n != "long"])
def test_lazy_tiles_equal_the_chunked_maps(name):
    q, k, v, mask, chunk = _case(name, seed=1)
    _, probs, _ = _reference(q, k, v, mask, chunk)
    o = AttentionOptions(mask=mask, causal=True, chunk=chunk)
    _, lse = lazy.keep_attention(q, k, v, o, 8)
    lo = lazy.LayerOptions.of(o, 8)
    B, H, N, M = probs.shape
    for b in range(B):
        for h in (0, H - 1):
            want = probs[b, h]
            torch.testing.assert_close(lazy.head_probs(q, k, lse, lo, h, batch=b), want, atol=1e-6, rtol=1e-6)
            r, c = (N // 3, N), (M // 4, M // 4 + 9)
            torch.testing.assert_close(lazy.head_probs(q, k, lse, lo, h, r, c, batch=b), want[r[0]:r[1], c[0]:c[1]],
                                       atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(lazy.head_row(q, k, lse, lo, h, N - 1, batch=b), want[N - 1], atol=1e-6,
                                       rtol=1e-6)
            torch.testing.assert_close(lazy.head_col(q, k, lse, lo, h, 0, batch=b), want[:, 0], atol=1e-6, rtol=1e-6)
            for cells, reduce in (((7, 5), "max"), ((4, 6), "mean"), (1000, "max")):
                got = lazy.head_pooled(q, k, lse, lo, h, cells, reduce, batch=b, tile=60).numpy()
                cr, cc = (cells, cells) if isinstance(cells, int) else cells
                np.testing.assert_allclose(got, pool2d(want.numpy(), min(cr, N), min(cc, M), reduce), atol=1e-6,
                                           rtol=1e-6)
