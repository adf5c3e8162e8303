"""The efficient attention variants against exact attention (and linear against its own O(n²) form)."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import torch

from attn_explorer.core.efficient import EXACT, VARIANTS, chunked, linear, linear_reference, naive, sdpa, window


def qkv(n: int, m: int | None = None, B: int = 2, H: int = 3, d: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    q = torch.randn(B, H, n, d, generator=g)
    k = torch.randn(B, H, m, d, generator=g)
    v = torch.randn(B, H, m, d, generator=g)
    return q, k, v


def block_diagonal(n: int, w: int) -> torch.Tensor:
    idx = torch.arange(n)
    return (idx[:, None] // w) == (idx[None, :] // w)


# --- chunked: exact, tile by tile ----------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 37, 130])  # 37 and 130 are not multiples of either block
@pytest.mark.parametrize("causal", [False, True])
def test_chunked_equals_naive(n, causal):
    q, k, v = qkv(n)
    want = naive(q, k, v, causal=causal)
    got = chunked(q, k, v, causal=causal, q_block=16, k_block=24)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_chunked_default_blocks_equal_naive_at_real_width():
    q, k, v = qkv(600, B=1, H=4, d=64, seed=1)
    torch.testing.assert_close(chunked(q, k, v), naive(q, k, v), atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked(q, k, v, causal=True), naive(q, k, v, causal=True), atol=1e-5, rtol=0)


def test_chunked_online_softmax_survives_a_rising_max():
    # The largest score sits in the last key block, so every earlier block must be rescaled.
    q, k, v = qkv(40, B=1, H=1, d=8, seed=2)
    k[..., -1, :] = q[..., :, :].mean(dim=-2) * 40
    torch.testing.assert_close(chunked(q, k, v, q_block=8, k_block=8), naive(q, k, v), atol=1e-5, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_chunked_with_a_mask_and_an_empty_row(causal):
    q, k, v = qkv(45, seed=3)
    mask = torch.rand(2, 1, 45, 45, generator=torch.Generator().manual_seed(4)) > 0.4
    mask[..., 0] = True
    mask[0, 0, 5] = False  # query 5 of the first batch may see nothing: output 0, not NaN
    want = naive(q, k, v, mask=mask, causal=causal)
    got = chunked(q, k, v, mask=mask, causal=causal, q_block=16, k_block=8)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert torch.isfinite(got).all()
    assert got[0, :, 5].abs().max() == 0


def test_chunked_cross_attention_lengths():
    q, k, v = qkv(9, 21, seed=5)
    torch.testing.assert_close(chunked(q, k, v, q_block=4, k_block=5), naive(q, k, v), atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked(q, k, v, causal=True, q_block=4, k_block=5), naive(q, k, v, causal=True),
                               atol=1e-5, rtol=0)


# --- window ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,w", [(1, 1), (20, 20), (20, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_window_equals_naive_when_the_window_covers_everything(n, w, causal):
    q, k, v = qkv(n)
    torch.testing.assert_close(window(q, k, v, causal=causal, window=w), naive(q, k, v, causal=causal),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("n,w", [(30, 8), (32, 8), (7, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_window_is_naive_with_a_block_diagonal_mask(n, w, causal):
    q, k, v = qkv(n)
    want = naive(q, k, v, mask=block_diagonal(n, w), causal=causal)
    torch.testing.assert_close(window(q, k, v, window=w, causal=causal), want, atol=1e-5, rtol=0)


def test_window_keeps_a_user_mask_inside_each_window():
    q, k, v = qkv(30)
    mask = torch.rand(30, 30, generator=torch.Generator().manual_seed(6)) > 0.3
    mask.fill_diagonal_(True)
    want = naive(q, k, v, mask=mask & block_diagonal(30, 8))
    torch.testing.assert_close(window(q, k, v, mask=mask, window=8), want, atol=1e-5, rtol=0)
    pad = torch.ones(2, 1, 1, 30, dtype=torch.bool)
    pad[..., 25:] = False  # a key-padding mask
    want = naive(q, k, v, mask=pad & block_diagonal(30, 8))
    torch.testing.assert_close(window(q, k, v, mask=pad, window=8), want, atol=1e-5, rtol=0)


def test_window_2d_squares_on_a_patch_grid():
    gh, gw, ws = 5, 7, 3  # 35 patches; windows hang off the right and bottom edges
    q, k, v = qkv(gh * gw)
    r, c = torch.arange(gh * gw) // gw, torch.arange(gh * gw) % gw
    same = ((r[:, None] // ws) == (r[None, :] // ws)) & ((c[:, None] // ws) == (c[None, :] // ws))
    torch.testing.assert_close(window(q, k, v, window=ws, grid=(gh, gw)), naive(q, k, v, mask=same),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(window(q, k, v, window=7, grid=(gh, gw)), naive(q, k, v), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="cells"):
        window(q, k, v, window=3, grid=(4, 4))


def test_window_differs_from_naive_when_the_window_is_small():
    q, k, v = qkv(64)
    assert (window(q, k, v, window=8) - naive(q, k, v)).abs().max() > 1e-2


# --- linear ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,chunk", [(1, 4), (50, 16), (64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_matches_its_quadratic_formula(n, chunk, causal):
    q, k, v = qkv(n)
    want = linear_reference(q, k, v, causal=causal)
    torch.testing.assert_close(linear(q, k, v, causal=causal, chunk=chunk), want, atol=1e-5, rtol=1e-5)


def test_linear_key_padding_mask_and_scale():
    q, k, v = qkv(40)
    pad = torch.ones(2, 1, 1, 40, dtype=torch.bool)
    pad[1, ..., 30:] = False
    torch.testing.assert_close(linear(q, k, v, mask=pad, scale=0.5), linear_reference(q, k, v, mask=pad, scale=0.5),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="key-padding"):
        linear(q, k, v, mask=torch.ones(40, 40, dtype=torch.bool))


def test_linear_is_an_approximation():
    q, k, v = qkv(64)
    assert (linear(q, k, v) - naive(q, k, v)).abs().max() > 1e-2


# --- sdpa and the family --------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_equals_naive(causal):
    q, k, v = qkv(33)
    torch.testing.assert_close(sdpa(q, k, v, causal=causal), naive(q, k, v, causal=causal), atol=1e-5, rtol=0)
    mask = torch.rand(33, 33, generator=torch.Generator().manual_seed(7)) > 0.3
    mask.fill_diagonal_(True)
    torch.testing.assert_close(sdpa(q, k, v, mask=mask, causal=causal), naive(q, k, v, mask=mask, causal=causal),
                               atol=1e-5, rtol=0)


def test_every_variant_has_exact_attentions_signature():
    for name, fn in VARIANTS.items():
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params[:6]] == ["q", "k", "v", "mask", "scale", "causal"], name
        assert params[3].default is None and params[4].default is None and params[5].default is False, name
    assert EXACT == {"naive", "chunked", "sdpa"}


def test_core_efficient_never_imports_qt():
    code = ("import sys, attn_explorer.core.efficient; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph')]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
