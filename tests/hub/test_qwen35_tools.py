"""Part C of issue 25 on the Gated DeltaNet hybrids (the tiny models of tests/hub/test_parity_qwen35.py): the hooks
(a recurrent layer's q, k, v, β, decay, its implicit map at hook_pattern, its heads' z), ablation and patching of a
recurrent head through hook_z, lazy runs (exact views of the signed maps from the kept q, k, g, β), and prefix
reuse."""
from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_5")

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis import interventions  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity_qwen35 import make_folder  # noqa: E402
from tests.hub.test_parity_rotary_families import folders  # noqa: E402

TEXT = "the cat sat on the mat and the dog ran to the park"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return folders(tmp_path_factory, make_folder)


@pytest.fixture(scope="module")
def model(built):
    return ax.load_model(str(built("qwen3_5")[1]), device="cpu")


def test_hooks_exist_and_the_pattern_is_the_implicit_map(model):
    names = model.hook_names()
    for p in ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_beta", "attn.hook_decay", "attn.hook_pattern",
              "attn.hook_z"):
        assert f"blocks.0.{p}" in names
    assert "blocks.3.attn.hook_beta" not in names and "blocks.3.attn.hook_pattern" in names
    r, cache = model.run_with_cache(TEXT)
    n = len(r.tokens)
    assert cache["blocks.0.attn.hook_q"].shape == (1, n, 2, 8) and cache["blocks.0.attn.hook_v"].shape == (1, n, 4, 12)
    assert cache["blocks.0.attn.hook_z"].shape == (1, n, 4, 12) and cache["blocks.3.attn.hook_z"].shape == (1, n, 6, 16)
    np.testing.assert_allclose(cache["blocks.0.attn.hook_pattern"][0].numpy(), r.attentions[0, :4], atol=1e-6)
    # a recurrent layer's pattern is its signed implicit map, one per value head (A @ V = the output before the gate
    # and norm is checked at module level in tests/core/test_deltanet.py)
    A = cache["blocks.1.attn.hook_pattern"][0].double()
    assert A.shape == (4, n, n) and (A.sum(-1) - 1).abs().max() > 1e-3  # rows do not sum to 1


def test_ablating_a_recurrent_head_goes_through_hook_z(model):
    r = model.run(TEXT, hidden=True)
    ablated = model.run(TEXT, ablate={(1, 2): "zero"}, hidden=True)
    np.testing.assert_array_equal(ablated.attentions[:2], r.attentions[:2])  # layers before it unchanged
    assert np.abs(ablated.hidden - r.hidden).max() > 1e-4

    def zero_head_2(z, name):
        z = z.clone()
        z[:, :, 2] = 0
        return z

    by_hand = model.run_with_hooks(TEXT, {"blocks.1.attn.hook_z": zero_head_2}, hidden=True)
    np.testing.assert_allclose(by_hand.hidden, ablated.hidden, atol=1e-6)
    c = interventions.compare(model, TEXT, {(1, 2): "mean"})
    assert c is not None


def test_patching_a_recurrent_head_with_its_own_output_changes_nothing(model):
    _, cache = model.run_with_cache(TEXT, names=["blocks.2.attn.hook_z"])
    z = cache["blocks.2.attn.hook_z"]
    r = model.run(TEXT, hidden=True)
    patched = model.run_with_hooks(TEXT, {"blocks.2.attn.hook_z": lambda t, name: z}, hidden=True)
    np.testing.assert_allclose(patched.hidden, r.hidden, atol=1e-6)


def _signed_max(a: np.ndarray, re, ce) -> np.ndarray:
    """Each cell's entry of largest magnitude, its sign kept (the pooled "max" of a signed map), by hand."""
    out = np.zeros((len(re) - 1, len(ce) - 1), dtype=np.float32)
    for i in range(len(re) - 1):
        for j in range(len(ce) - 1):
            cell = a[re[i]:re[i + 1], ce[j]:ce[j + 1]].ravel()
            out[i, j] = cell[np.abs(cell).argmax()]
    return out


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_next"])
def test_lazy_equals_dense(built, name):
    """A lazy run keeps the Gated DeltaNet layers' q, k (per key head), g and β (O(n)) and serves every view of their
    signed maps exactly: whole maps, a row, a column, a window, pooled means and signed maxima equal the dense run's
    within 1e-6, the softmax layers' too."""
    from attn_explorer.maths import pool2d, pool_edges
    m = ax.load_model(str(built(name)[1]), device="cpu")
    text = " ".join([TEXT] * 8)  # past one 64-token chunk
    dense, lazy = m.run(text), m.run(text, lazy=True)
    assert lazy.is_lazy and "deltanet" in m.info.mixers
    n = len(dense.tokens)
    assert n > 64
    for layer in range(m.info.num_layers):
        for head in range(m.info.layer_heads[layer]):
            np.testing.assert_allclose(lazy.attention(layer, head), dense.attentions[layer, head], atol=1e-6, rtol=0)
    want = dense.attentions[1, 2]
    assert np.abs(want).max() > 1e-2 and (want < -1e-4).any()  # a signed map, not zeros
    np.testing.assert_allclose(lazy.attention(1, 2, rows=70), want[70], atol=1e-6, rtol=0)
    np.testing.assert_allclose(lazy.attention(1, 2, cols=3), want[:, 3], atol=1e-6, rtol=0)
    np.testing.assert_allclose(lazy.attention(1, 2, rows=(9, 80), cols=(2, 70)), want[9:80, 2:70], atol=1e-6, rtol=0)
    np.testing.assert_allclose(lazy.attention(1, 2, rows=(3, 9), cols=(20, 30)), 0.0, atol=0)  # above the diagonal
    assert lazy.attention(1, 2, rows=70, cols=3) == pytest.approx(float(want[70, 3]), abs=1e-6)
    np.testing.assert_allclose(lazy.attention(1, 2, pool=7, reduce="mean"), pool2d(want, 7, 7, "mean"), atol=1e-6)
    np.testing.assert_allclose(lazy.attention(1, 2, pool=(9, 5)),
                               _signed_max(want, pool_edges(n, 9), pool_edges(n, 5)), atol=1e-6)
    # bands of a few rows that straddle the pooled cells (as a long map's bands do)
    kept = lazy.lazy.layers[1]
    re, ce = pool_edges(n, 6), pool_edges(n, 4)
    for reduce, ref in (("mean", pool2d(want, 6, 4, "mean")), ("max", _signed_max(want, re, ce))):
        got = kept.pooled(2, re, ce, reduce, slice(0, n), slice(0, n), block=5 * n).numpy()
        np.testing.assert_allclose(got, ref, atol=1e-6)


def test_lazy_prefix_reuse_serves_the_new_rows_exactly(built):
    """Text added at the end of a lazy run with reuse_prefix: the store holds every token's q, k, g, β (the cache's),
    and its maps equal a fresh dense run's (within the float32 continuation rounding), its first rows exactly."""
    m = ax.load_model(str(built("qwen3_5")[1]), device="cpu")
    m.run(TEXT, reuse_prefix=True, lazy=True)
    longer = TEXT + " and the bird flew over the house"
    again = m.run(longer, reuse_prefix=True, lazy=True)
    assert again.is_lazy and again.reuse.startswith("reused") and not again.reuse.startswith("reused 0"), again.reuse
    fresh = ax.load_model(str(built("qwen3_5")[1]), device="cpu").run(longer)
    p = len(m.prepare(TEXT).tokens)
    for layer in (0, 1, 3):
        got = again.attention(layer, 1)
        np.testing.assert_allclose(got, fresh.attentions[layer, 1], atol=1e-4)
        np.testing.assert_allclose(got[:p, :p], fresh.attentions[layer, 1, :p, :p], atol=1e-6)


def test_a_long_lazy_run_keeps_a_sliver_of_the_maps(tmp_path):
    """About 1,500 tokens on Qwen3.5, lazy: the store (the DeltaNet layers' q, k, g, β; the softmax layer's q, k,
    lse) is under 1 % of the dense maps' bytes, and a pooled 64 × 64 view of a DeltaNet head is its full map's."""
    from attn_explorer.maths import pool2d
    from tests.hub import test_parity_qwen35 as q35
    from tests.hub import test_parity_rotary_families as rotary
    q35_common = dict(q35.COMMON, max_position_embeddings=4096)
    rotary.make_folder(tmp_path, "long", {"long": q35.CASES["qwen3_5"]}, q35_common, seed=300)
    m = ax.load_model(str(tmp_path), device="cpu")
    r = m.run(" ".join([TEXT] * 48), lazy=True)
    n = len(r.tokens)
    assert n > 1400 and r.lazy.bytes_kept < 0.01 * r.lazy.dense_bytes, (n, r.lazy.bytes_kept, r.lazy.dense_bytes)
    from attn_explorer.api.lazy import module_kept_bytes
    need = module_kept_bytes(m.module, n, m.info.num_layers, *m._head_shape(), m.dtype.itemsize)
    assert need == r.lazy.bytes_kept  # the memory guard counts what is really kept
    full = r.attention(2, 3)
    assert full.shape == (n, n) and np.abs(full).max() > 1e-2
    np.testing.assert_allclose(r.attention(2, 3, pool=64, reduce="mean"), pool2d(full, 64, 64, "mean"), atol=1e-6)


def test_prefix_reuse_equals_a_fresh_run_or_is_refused_in_one_line(model, built):
    model.run(TEXT, reuse_prefix=True, hidden=True)
    edited = TEXT.replace("park", "house")
    try:
        again = model.run(edited, reuse_prefix=True, hidden=True)
    except UserError as e:
        assert "\n" not in str(e) and "recurrent" in str(e)
        return
    fresh = ax.load_model(str(built("qwen3_5")[1]), device="cpu").run(edited, hidden=True)
    np.testing.assert_allclose(again.hidden, fresh.hidden, atol=1e-5)
    np.testing.assert_allclose(again.attentions, fresh.attentions, atol=1e-6)


def test_prefix_reuse_continues_the_recurrent_state_when_text_is_added(built):
    """Text added at the end: the recurrent states go on from the kept ones, and the new rows of the implicit maps
    are exact (the kept q, k, g, β); an edit inside the text runs every token again and says why."""
    m = ax.load_model(str(built("qwen3_5")[1]), device="cpu")
    m.run(TEXT, reuse_prefix=True, hidden=True)
    longer = TEXT + " and the bird flew over the house"
    again = m.run(longer, reuse_prefix=True, hidden=True)
    assert again.reuse.startswith("reused") and not again.reuse.startswith("reused 0"), again.reuse
    fresh = ax.load_model(str(built("qwen3_5")[1]), device="cpu").run(longer, hidden=True)
    # float32: going on from a state splits the chunks elsewhere, and the rounding moves; transformers' own
    # continuation differs from its full run by the same order (2e-5 on these weights), ours from theirs by 2e-6
    np.testing.assert_allclose(again.hidden, fresh.hidden, atol=5e-4)
    np.testing.assert_allclose(again.attentions, fresh.attentions, atol=1e-4)
    n = len(m.prepare(TEXT).tokens)
    np.testing.assert_allclose(again.attentions[:, :, :n, :n], fresh.attentions[:, :, :n, :n], atol=1e-6)
    edited = m.run(longer.replace("cat", "cow"), reuse_prefix=True)
    assert edited.reuse.startswith("reused 0") and "recurrent" in edited.reuse, edited.reuse


def test_direct_logit_attribution_splits_recurrent_heads_and_adds_up(model):
    """A recurrent head's direct share is its z times its slice of out_proj (as W_O's for a softmax head); heads past
    a layer's own are 0; the pieces add up to the logit."""
    from attn_explorer.analysis import lens

    a = lens.logit_attribution(model, TEXT)
    assert a.heads.shape == (4, 6) and (a.heads[:3, 4:] == 0).all() and (a.heads[:3, :4] != 0).all()
    total = a.embeddings + a.heads.sum() + a.mlps.sum() + a.biases
    assert abs(total - a.logit) <= 1e-3 * max(1.0, abs(a.logit)), (total, a.logit)


def test_relevance_methods_run_on_the_recurrent_maps(model):
    """gradient_rollout reaches the recurrent layers' maps (the output goes through A @ V under autograd)."""
    from attn_explorer.analysis.relevance import METHODS, explain

    n = len(model.prepare(TEXT).tokens)
    for method in METHODS:
        r = explain(model, TEXT, method=method)
        scores = np.asarray(r.scores if hasattr(r, "scores") else r)
        assert scores.shape[-1] == n and np.isfinite(scores).all(), method
