"""Gated DeltaNet (core.deltanet): the chunked form equals the plain recurrence and transformers' torch functions,
and the implicit map A (o_t = Σ_s A[t, s] v_s) reproduces the output within 1e-5 relative, also where the decay
nearly vanishes (exp(g) ~ 1e-13) and β is near 1; its tiles equal the dense map's; the layer's hooks; a lazy pass
keeps q, k, g, β and its views equal the dense map."""
from __future__ import annotations

import pytest
import torch

from attn_explorer.core.deltanet import (DeltaNetConfig, chunked_delta_rule, delta_rule, implicit_map, map_tile)
from attn_explorer.core.hooks import Hooks
from attn_explorer.core.attention import AttentionOptions
from attn_explorer.core.recurrent import RecurrentState


def inputs(B=2, H=3, N=150, dk=8, dv=6, g_scale=1.0, beta=None, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, N, dk, generator=gen), torch.randn(B, H, N, dk, generator=gen)
    q = q / q.norm(dim=-1, keepdim=True) * dk ** -0.5
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(B, H, N, dv, generator=gen) * 3
    g = -torch.rand(B, H, N, generator=gen) * g_scale
    b = torch.rand(B, H, N, generator=gen) if beta is None else torch.full((B, H, N), beta)
    return tuple(t.to(dtype) for t in (q, k, v, g, b))


def test_chunked_equals_the_plain_recurrence_across_chunks_and_from_a_state():
    q, k, v, g, b = inputs()
    plain, S = delta_rule(q, k, v, g, b)
    chunked, S2 = chunked_delta_rule(q, k, v, g, b, chunk=64)  # 150 tokens: three chunks, the last padded
    assert (plain - chunked).abs().max() < 1e-12 and (S - S2).abs().max() < 1e-12
    half, S_half = chunked_delta_rule(q[:, :, :70], k[:, :, :70], v[:, :, :70], g[:, :, :70], b[:, :, :70])
    rest, _ = chunked_delta_rule(q[:, :, 70:], k[:, :, 70:], v[:, :, 70:], g[:, :, 70:], b[:, :, 70:], S_half)
    assert (torch.cat([half, rest], 2) - plain).abs().max() < 1e-12


def test_equals_transformers_torch_functions():
    T = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = torch.Generator().manual_seed(3)
    B, N, Hk, Hv, dk, dv = 2, 90, 2, 4, 8, 6
    q, k = torch.randn(B, N, Hk, dk, generator=gen), torch.randn(B, N, Hk, dk, generator=gen)
    v = torch.randn(B, N, Hv, dv, generator=gen)
    g, b = -torch.rand(B, N, Hv, generator=gen) * 2, torch.rand(B, N, Hv, generator=gen)
    ref, ref_S = T.torch_chunk_gated_delta_rule(q, k, v, g, b, use_qk_l2norm_in_kernel=True, output_final_state=True)
    ours_q = (q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)).transpose(1, 2).repeat_interleave(2, 1)
    ours_k = (k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)).transpose(1, 2).repeat_interleave(2, 1)
    o, S = chunked_delta_rule(ours_q * dk ** -0.5, ours_k, v.transpose(1, 2), g.transpose(1, 2), b.transpose(1, 2))
    assert torch.equal(o.transpose(1, 2), ref) and torch.equal(S, ref_S)
    step, _ = T.torch_recurrent_gated_delta_rule(q[:, :1], k[:, :1], v[:, :1], g[:, :1], b[:, :1],
                                                 initial_state=ref_S, use_qk_l2norm_in_kernel=True)
    mine, _ = delta_rule(ours_q[:, :, :1] * dk ** -0.5, ours_k[:, :, :1], v[:, :1].transpose(1, 2),
                         g[:, :1].transpose(1, 2), b[:, :1].transpose(1, 2), S)
    assert (mine.transpose(1, 2) - step).abs().max() < 1e-6


CASES = {"plain": {}, "decay nearly vanishes": dict(g_scale=60.0), "beta near 1": dict(beta=0.99999),
         "no decay, beta near 1": dict(g_scale=1e-6, beta=0.99999)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_implicit_map_times_v_is_the_output(case, dtype):
    q, k, v, g, b = inputs(dtype=dtype, **CASES[case])
    o, _ = chunked_delta_rule(*(t.double() for t in (q, k, v, g, b)))
    A = implicit_map(q, k, g, b)
    assert A.dtype == dtype and torch.equal(A.triu(1), torch.zeros_like(A))
    rel = ((A.double() @ v.double()) - o).norm() / o.norm()
    print(f"implicit map {case} {dtype}: |A V - o| / |o| = {rel:.1e}")
    assert rel <= 1e-5
    # per row, too (a row with a tiny output is not hidden by the others)
    rows = ((A.double() @ v.double()) - o).norm(dim=-1) / o.norm(dim=-1).clamp_min(1e-6)
    assert rows.max() <= (1e-5 if dtype == torch.float64 else 1e-3)


def test_a_vanishing_decay_keeps_only_the_last_token():
    q, k, v, g, b = inputs(g_scale=0.0)
    g = torch.full_like(g, -80.0)  # exp(-80): the state forgets everything at each step
    A = implicit_map(q, k, g, b)
    diag = torch.diagonal(A, dim1=-2, dim2=-1)
    assert (A - torch.diag_embed(diag)).abs().max() < 1e-30
    assert torch.allclose(diag, b * (q * k).sum(-1))


def test_tiles_equal_the_dense_map():
    q, k, v, g, b = inputs(N=150)
    A = implicit_map(q, k, g, b)
    for rows, cols in [(slice(0, 150), slice(0, 150)), (slice(100, 140), slice(10, 70)), (slice(5, 20), slice(30, 60)),
                       (slice(64, 130), slice(60, 129))]:
        assert (map_tile(q, k, g, b, rows, cols) - A[:, :, rows, cols]).abs().max() < 1e-12


@pytest.mark.parametrize("case", ["plain", "vanishing decay", "beta near 1"])
def test_row_bands_equal_the_dense_map(case):
    """map_bands (the one-hot recurrence a band of rows at a time, its d_k × width state carried; what a lazy view
    uses): its bands joined equal the dense map in float64, for small bands and large, any window."""
    from attn_explorer.core.deltanet import map_bands
    q, k, v, g, b = inputs(N=150, g_scale=30.0 if case == "vanishing decay" else 1.0,
                           beta=0.999999 if case == "beta near 1" else None)
    A = implicit_map(q, k, g, b)
    for rows, cols, block in [(slice(0, 150), slice(0, 150), 1 << 20), (slice(0, 150), slice(0, 150), 150 * 64),
                              (slice(100, 140), slice(10, 70), 60 * 64), (slice(5, 20), slice(30, 60), 1 << 20),
                              (slice(64, 130), slice(60, 129), 1), (slice(40, 150), slice(0, 3), 3 * 128)]:
        bands = list(map_bands(q, k, g, b, rows, cols, block=block))
        assert [x[0] for x in bands][0] == rows.start and bands[-1][1] == rows.stop
        assert all(x[1] == y[0] for x, y in zip(bands, bands[1:]))
        got = torch.cat([x[2] for x in bands], dim=2)
        assert (got - A[:, :, rows, cols]).abs().max() < 1e-12, (rows, cols, block)


def layer(**kw):
    torch.manual_seed(0)
    c = DeltaNetConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=6, **kw)
    m = c.build(24).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m


def test_the_layer_returns_its_maps_and_they_give_its_output():
    m = layer()
    x = torch.randn(2, 70, 24)
    with torch.no_grad():
        out, maps = m(x, AttentionOptions(need_weights=True))
        plain, none = m(x, AttentionOptions())
        q, k, v, g, beta, z, _ = m.per_token(x)
        o, _ = chunked_delta_rule(q, k, v, g, beta)
    assert none is None and maps.shape == (2, 4, 70, 70) and torch.equal(out, plain)
    assert ((maps @ v) - o).norm() / o.norm() <= 1e-5


def test_the_hooks_see_and_change_the_layer():
    m = layer()
    x = torch.randn(1, 20, 24)
    seen = {}

    def keep(t, name):
        seen[name] = t.clone()

    names = ["attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_beta", "attn.hook_decay", "attn.hook_pattern",
             "attn.hook_z"]
    hooks = Hooks({f"blocks.0.{n}": (keep,) for n in names})
    with torch.no_grad():
        out, _ = m(x, AttentionOptions(hooks=hooks.layer(0)))
        ref, maps = m(x, AttentionOptions(need_weights=True))
    assert torch.allclose(out, ref, atol=1e-6)
    assert seen["blocks.0.attn.hook_q"].shape == (1, 20, 2, 8) and seen["blocks.0.attn.hook_v"].shape == (1, 20, 4, 6)
    assert seen["blocks.0.attn.hook_beta"].shape == (1, 20, 4) and (seen["blocks.0.attn.hook_decay"] <= 0).all()
    assert torch.allclose(seen["blocks.0.attn.hook_pattern"], maps)
    # zeroing head 1 at hook_z is zeroing its share of out_proj's input
    zero = Hooks({"blocks.0.attn.hook_z": (lambda z, n: z.index_fill(2, torch.tensor([1]), 0.0),)})
    with torch.no_grad():
        ablated, _ = m(x, AttentionOptions(hooks=zero.layer(0)))
        z = seen["blocks.0.attn.hook_z"].clone()
        z[:, :, 1] = 0
        assert torch.allclose(ablated, m.out_proj(z.reshape(1, 20, 24)), atol=1e-6)
    # a replaced pattern weighs the values: keeping only the diagonal
    diag = Hooks({"blocks.0.attn.hook_pattern": (lambda a, n: torch.diag_embed(torch.diagonal(a, dim1=-2, dim2=-1)),)})
    with torch.no_grad():
        changed, _ = m(x, AttentionOptions(hooks=diag.layer(0)))
    assert (changed - ref).abs().max() > 1e-3


def test_the_recurrent_cache_gives_the_same_tokens_as_one_pass():
    m = layer()
    x = torch.randn(2, 30, 24)
    with torch.no_grad():
        whole, _ = m(x, AttentionOptions())
        state = RecurrentState()
        first, _ = m(x[:, :17], AttentionOptions(kv=state))
        steps = [m(x[:, t:t + 1], AttentionOptions(kv=state))[0] for t in range(17, 30)]
    assert state.length == 30
    assert (torch.cat([first, *steps], 1) - whole).abs().max() < 1e-5
    with pytest.raises(ValueError, match="cannot go back"):
        state.truncate(10)


def test_a_lazy_pass_keeps_the_per_token_quantities_and_its_views_equal_the_dense_map():
    """Hooks(keep=True): the layer keeps q, k per key head, g and β (no map); tiles, bands split over many pieces (the
    state carried between them) and pooled means / signed maxima equal the dense map; hook_pattern is refused."""
    from attn_explorer.core.deltanet import KeptDeltaNet, map_bands
    m = layer(family="qwen3_5_text")
    x = torch.randn(1, 150, 24)
    with torch.no_grad():
        _, dense = m(x, AttentionOptions(need_weights=True))
        hooks = Hooks(keep=True)
        m(x, AttentionOptions(hooks=hooks.layer(0)))
    kept = hooks.kept[0]
    assert isinstance(kept, KeptDeltaNet) and kept.heads == m.num_heads and kept.n == 150
    assert kept.q.shape[1] == m.c.num_k_heads  # per key head: not repeated to the value heads
    for h in range(kept.heads):
        assert (kept.tile(h, slice(0, 150), slice(0, 150)) - dense[0, h]).abs().max() < 1e-6
    h, A = 3, dense[0, 3].double()
    assert (kept.tile(h, slice(70, 140), slice(65, 90)) - A[70:140, 65:90]).abs().max() < 1e-6
    assert kept.tile(h, slice(0, 20), slice(30, 50)).abs().max() == 0  # above the diagonal
    pieces = list(map_bands(*kept._head(h), slice(10, 150), slice(5, 120), block=64 * 115))
    assert len(pieces) > 2 and pieces[0][0] == 10 and pieces[-1][1] == 150
    assert (torch.cat([p[2][0, 0] for p in pieces]) - A[10:, 5:120]).abs().max() < 1e-6
    re, ce = [0, 7, 40, 41, 100, 150], [0, 3, 60, 150]
    got = kept.pooled(h, re, ce, "mean", slice(0, 150), slice(0, 150), block=150 * 64)
    want = torch.tensor([[A[re[i]:re[i + 1], ce[j]:ce[j + 1]].mean() for j in range(3)] for i in range(5)])
    assert (got - want).abs().max() < 1e-6
    got = kept.pooled(h, re, ce, "max", slice(0, 150), slice(0, 150), block=150 * 64)
    for i in range(5):
        for j in range(3):
            cell = A[re[i]:re[i + 1], ce[j]:ce[j + 1]].flatten()
            assert abs(float(got[i, j]) - float(cell[cell.abs().argmax()])) < 1e-6
    with pytest.raises(ValueError, match="lazy"):
        m(x, AttentionOptions(hooks=Hooks(fns={"blocks.0.attn.hook_pattern": (lambda a, n: a,)}, keep=True).layer(0)))


def _dense_pool(A, re, ce, reduce):
    """A (rows, cols) float64 pooled by hand: each cell's mean or its signed entry of largest magnitude."""
    out = torch.empty(len(re) - 1, len(ce) - 1, dtype=torch.float64)
    for i in range(len(re) - 1):
        for j in range(len(ce) - 1):
            cell = A[re[i]:re[i + 1], ce[j]:ce[j + 1]].flatten()
            out[i, j] = cell.mean() if reduce == "mean" else cell[cell.abs().argmax()]
    return out


@pytest.mark.parametrize("reduce", ["max", "mean"])
@pytest.mark.parametrize("case", ["plain", "no decay, beta near 1"])
def test_pooled_views_over_many_blocks_equal_the_dense_map(case, reduce):
    """core.delta_map.pool_map: 700 tokens are three blocks of 256 rows (the state carried from block to block,
    the blocks' own triangles laid over the product), each band in tiles of a few cells (the buffer reused), only
    the columns a band can reach computed; cells that do not divide the map, a window of rows and columns. Equal to
    the dense float64 map pooled by hand, to float32's rounding."""
    from attn_explorer.core.deltanet import KeptDeltaNet
    from attn_explorer.core.lazy import pool_edges
    q, k, v, g, b = inputs(B=1, H=2, N=700, dtype=torch.float32, **CASES[case])
    kept = KeptDeltaNet(q[:, :1], k[:, :1], g, b)  # two value heads on one key head
    for h in range(2):
        A = implicit_map(*(t.double() for t in (q[:, :1], k[:, :1], g[:, h:h + 1], b[:, h:h + 1])))[0, 0]
        for rows, cols, cells, block in [(slice(0, 700), slice(0, 700), (37, 53), 256 * 64),
                                         (slice(0, 700), slice(0, 700), (700, 700), 1 << 20),
                                         (slice(300, 650), slice(20, 610), (9, 31), 256 * 100)]:
            re = pool_edges(rows.stop - rows.start, cells[0]).tolist()
            ce = pool_edges(cols.stop - cols.start, cells[1]).tolist()
            got = kept.pooled(h, re, ce, reduce, rows, cols, block=block)
            want = A[rows, cols] if cells == (700, 700) else _dense_pool(A[rows, cols], re, ce, reduce)
            assert got.dtype == torch.float32 and got.shape == want.shape
            err = (got.double() - want).abs().max().item()
            assert err <= 1e-7 * want.abs().max().item(), (rows, cols, cells, err)
