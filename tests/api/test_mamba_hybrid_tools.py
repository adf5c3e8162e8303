"""Issue 25 part C on the Mamba-2 hybrids (tiny random folders, as tests/hub/test_parity_mamba_hybrids builds them):
Granite 4 hybrid (Mamba-2, attention, Mamba-2; MoE) and Falcon-H1 (attention and Mamba-2 in every layer). The
hook points, run_with_cache, the implicit map at hook_pattern, lazy attention (exact tiles of the signed maps from
the kept B, C, dt and A; Falcon-H1's maps are its softmax attention's), prefix reuse, ablation of a
Mamba-2 head through attn.hook_z, patching, relevance; the logit lens refused in one line naming the family."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity_mamba_hybrids import CASES  # noqa: E402
from tests.hub.test_parity_rotary_families import make_folder  # noqa: E402

TEXT = "The capital of France is Paris. The capital of Italy is Rome and the capital of Spain"
TOOLS = {  # Granite 4: 4 Mamba-2 heads beside 6 attention heads (the maps' heads 4, 5 of layers 0 and 2 are 0)
    "granite4": CASES["granite4"],
    "falcon_h1": CASES["falcon_h1"],
}


@pytest.fixture(scope="module", params=list(TOOLS))
def m(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    make_folder(folder, request.param, cases=TOOLS)
    return ax.load_model(str(folder), device="cpu")


def _granite(m):
    return m.info.family == "granitemoehybrid"


def test_hook_names_and_run_with_cache(m):
    names = m.hook_names()
    if _granite(m):
        assert m.info.mixers == ("mamba2", "softmax", "mamba2")
        assert m.info.layer_kinds == ("Mamba-2 (implicit)", "softmax, global", "Mamba-2 (implicit)")
        assert "blocks.0.attn.hook_dt" in names and "blocks.1.attn.hook_dt" not in names
    else:
        assert m.info.layer_kinds[0] == "softmax, global + Mamba-2 (not drawn)"
    r, cache = m.run_with_cache(TEXT)
    assert set(names) - set(cache) == set()
    # layer 0's hook_pattern is the map the run returns: on Granite the signed implicit map of its Mamba-2 heads
    pattern = cache["blocks.0.attn.hook_pattern"][0].numpy()
    np.testing.assert_allclose(pattern, r.attentions[0, :pattern.shape[0]], atol=1e-6)
    if _granite(m):
        a = r.attentions[0]
        assert m.info.layer_heads == (4, 6, 4) and np.all(a[4:] == 0)  # no heads 4, 5 on a Mamba-2 layer
        assert (a[:4] < 0).any() and np.all(np.triu(a[:4], 1) == 0)  # signed, causal
        with pytest.raises(UserError, match="no head L0 H5.*heads 0..3") as e:
            m.run(TEXT, ablate={(0, 5): "zero"})
        assert "\n" not in str(e.value)


def test_lazy(m):
    """A lazy run keeps the Mamba-2 layers' B, C, dt and A (O(n)) and computes any tile of their signed maps
    exactly: full maps, one row, one column, pooled means and signed maxima equal the dense run's."""
    from attn_explorer.maths import pool2d
    dense, lazy = m.run(TEXT), m.run(TEXT, lazy=True)
    assert lazy.is_lazy
    n = len(dense.tokens)
    for layer in range(3):
        for head in range(m.info.layer_heads[layer] if m.info.layer_heads else 6):
            want = dense.attentions[layer, head]
            tol = 2e-6 * max(1.0, float(np.abs(want).max()))  # a Python float: pytest 9.2's approx refuses numpy's
            np.testing.assert_allclose(lazy.attention(layer, head), want, atol=tol, rtol=0)
    want = dense.attentions[0, 1]
    tol = 2e-6 * max(1.0, float(np.abs(want).max()))  # a Python float: pytest 9.2's approx refuses numpy's
    np.testing.assert_allclose(lazy.attention(0, 1, rows=7), want[7], atol=tol, rtol=0)
    np.testing.assert_allclose(lazy.attention(0, 1, cols=3), want[:, 3], atol=tol, rtol=0)
    np.testing.assert_allclose(lazy.attention(0, 1, rows=(9, 20), cols=(2, 12)), want[9:20, 2:12], atol=tol, rtol=0)
    assert lazy.attention(0, 1, rows=7, cols=3) == pytest.approx(float(want[7, 3]), abs=tol)
    np.testing.assert_allclose(lazy.attention(0, 1, pool=5, reduce="mean"), pool2d(want, 5, 5, "mean"), atol=tol)
    if _granite(m):  # a signed map's pooled "max" keeps the entry of largest magnitude, its sign too
        big = lazy.attention(0, 1, pool=(n, 4))
        for j, (a, b) in enumerate(zip(*[np.linspace(0, n, 5).astype(int)[k:k + 4 + (1 - k)] for k in (0, 1)])):
            block = want[:, a:b]
            np.testing.assert_allclose(big[:, j], block[np.arange(n), np.abs(block).argmax(1)], atol=tol)
        with pytest.raises(UserError, match="no head L0 H5.*heads 0..3") as e:
            lazy.attention(0, 5)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("lazy", [False, True])
def test_prefix_reuse(m, lazy):
    """Appending to the text goes on from the kept recurrent states (equal to a fresh run: hidden states, and the
    maps, lazy ones spliced from the kept C rows); an edit inside the text runs every token again and says why."""
    from attn_explorer.api import prefix
    prefix.forget()
    m.run(TEXT, reuse_prefix=True, hidden=True, lazy=lazy)
    longer = TEXT + " is Madrid"
    r = m.run(longer, reuse_prefix=True, hidden=True, lazy=lazy)
    assert r.reuse.startswith("reused ") and not r.reuse.startswith("reused 0")
    fresh = m.run(longer, hidden=True)
    np.testing.assert_allclose(r.hidden, fresh.hidden, atol=1e-5)
    for layer in range(3):
        want = fresh.attentions[layer, 1]
        got = r.attention(layer, 1) if lazy else r.attentions[layer, 1]
        np.testing.assert_allclose(got, want, atol=2e-6 * max(1.0, np.abs(want).max()))
    edited = m.run(TEXT.replace("Italy", "Japan"), reuse_prefix=True, hidden=True, lazy=lazy)
    assert edited.reuse.startswith("reused 0 of") and "cannot go back" in edited.reuse
    np.testing.assert_allclose(edited.hidden, m.run(TEXT.replace("Italy", "Japan"), hidden=True).hidden, atol=1e-5)
    prefix.forget()


def test_ablating_a_mamba_head_through_hook_z(m):
    """ablate={(0, 1): 'zero'} on Granite's Mamba-2 layer 0 zeroes that head's channels of out_proj's input: the
    same hidden state as a hand-written hook doing it, different from the plain run."""
    base = m.run(TEXT, hidden=True)
    off = m.run(TEXT, hidden=True, ablate={(0, 1): "zero"})
    assert np.abs(off.hidden - base.hidden).max() > 1e-4

    def zero(z, name):
        z = z.clone()
        z[:, :, 1] = 0
        return z
    by_hand = m.run_with_hooks(TEXT, hidden=True, hooks={"blocks.0.attn.hook_z": zero})
    np.testing.assert_allclose(off.hidden, by_hand.hidden, atol=1e-6)
    mean = m.run(TEXT, hidden=True, ablate={(2, 3): "mean"})
    assert np.abs(mean.hidden - base.hidden).max() > 1e-5


def test_patching_and_compare(m):
    from attn_explorer.analysis import interventions
    assert interventions.compare(m, TEXT, {(0, 1): "zero"}) is not None
    corrupt = TEXT.replace("France", "Japan")
    assert len(m.prepare(corrupt).tokens) == len(m.prepare(TEXT).tokens)
    p = interventions.patch(m, TEXT, corrupt, heads=[(0, h) for h in range(4)])
    assert np.isfinite(p.patched) and p.patched != p.corrupt
    assert np.isfinite(interventions.patch(m, TEXT, corrupt).patched)  # every head of every layer
    # the scans cover every head that exists: Granite's Mamba-2 layers have 4 of the grid's 6. As the maps hold 0
    # there (no NaN in a run, a file or a view), a head that does not exist holds the metric of nothing changed
    # (clean for an ablation, corrupt for a patch: effect 0), `exists` says which, and no ranking names one
    for scan in (interventions.ablation_scan(m, TEXT), interventions.patching_scan(m, TEXT, corrupt)):
        grid, nothing = scan.values, scan.clean if scan.corrupt is None else scan.corrupt
        assert grid.shape == (3, 6) and np.isfinite(grid).all() and np.isfinite(scan.effect).all()
        heads = m.info.layer_heads or (6, 6, 6)
        assert scan.exists.tolist() == [[h < n for h in range(6)] for n in heads]
        for layer, n in enumerate(heads):
            assert np.all(grid[layer, n:] == nothing) and np.all(scan.effect[layer, n:] == 0)
        named = scan.ranked()
        assert sorted((l, h) for l, h, _ in named) == [(l, h) for l, n in enumerate(heads) for h in range(n)]
        json.dumps(scan.to_dict(), allow_nan=False)  # strict JSON: no NaN
        assert scan.to_dict()["exists"] == scan.exists.tolist() and np.array_equal(scan.to_arrays()["exists"],
                                                                                    scan.exists)


@pytest.mark.parametrize("method", ["gradient_rollout", "attnlrp", "rollout", "attention"])
def test_relevance_runs(m, method):
    from attn_explorer.analysis.relevance import explain
    r = explain(m, TEXT, method=method)
    assert r.scores.shape == (len(m.prepare(TEXT).tokens),) and np.isfinite(r.scores).all()


def test_the_lens_refuses_in_one_line(m):
    from attn_explorer.analysis import lens
    with pytest.raises(UserError, match=m.info.family) as e:
        lens.logit_attribution(m, TEXT)
    assert "\n" not in str(e.value)


def test_long_input_statistics_refuse_a_recurrent_store_in_one_line():
    """The long-input head statistics and rollout read softmax rows (q, k, lse): a store with a Mamba-2 layer's
    kept B, C, dt says so in one line instead of failing on a missing q."""
    from attn_explorer.analysis import long
    from attn_explorer.api.lazy import LazyAttention
    from attn_explorer.core.mamba2 import KeptMamba
    g = torch.Generator().manual_seed(0)
    kept = KeptMamba(torch.rand(1, 9, 4, generator=g), -torch.rand(4, generator=g), torch.randn(1, 9, 2, 3, generator=g),
                     torch.randn(1, 9, 2, 3, generator=g))
    store = LazyAttention([kept])
    assert store.shape == (1, 4, 9, 9) and store.attention(0, 3).shape == (9, 9)
    with pytest.raises(UserError, match="mamba2") as e:
        long.layers_of(store)
    assert "\n" not in str(e.value)


def test_a_long_lazy_run_keeps_a_sliver_of_the_maps(tmp_path):
    """About 1,500 tokens on Granite 4, lazy: the store (the Mamba-2 layers' B, C, dt; the softmax layer's q, k,
    lse) is under 1 % of the dense maps' bytes, and a pooled 64 × 64 view of a Mamba-2 head is the pooled mean of
    its full map."""
    from attn_explorer.maths import pool2d
    from tests.hub.test_parity_rotary_families import COMMON
    cfg, model, extra = CASES["granite4"]
    make_folder(tmp_path, "long", cases={"long": (cfg, model, dict(extra, mamba_chunk_size=256))},
                common=dict(COMMON, max_position_embeddings=4096))
    m = ax.load_model(str(tmp_path), device="cpu")
    r = m.run(" ".join([TEXT] * 90), lazy=True)
    n = len(r.tokens)
    assert n > 1400 and r.lazy.bytes_kept < 0.01 * r.lazy.dense_bytes, (n, r.lazy.bytes_kept, r.lazy.dense_bytes)
    full = r.attention(2, 3)
    assert full.shape == (n, n)
    np.testing.assert_allclose(r.attention(2, 3, pool=64, reduce="mean"), pool2d(full, 64, 64, "mean"), atol=1e-6)
