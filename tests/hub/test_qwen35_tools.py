"""Part C of issue 25 on the Gated DeltaNet hybrids (the tiny models of tests/hub/test_parity_qwen35.py): the hooks
(a recurrent layer's q, k, v, β, decay, its implicit map at hook_pattern, its heads' z), ablation and patching of a
recurrent head through hook_z, and what is refused in one line (lazy runs, prefix reuse)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

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
    # the implicit map times the values is the output before the gate and norm: A @ V, per value head
    A, v = cache["blocks.1.attn.hook_pattern"][0].double(), cache["blocks.1.attn.hook_v"][0].transpose(0, 1).double()
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


def test_lazy_runs_are_refused_in_one_line_naming_the_family(model):
    with pytest.raises(UserError) as e:
        model.run(TEXT, lazy=True)
    assert "qwen3_5_text" in str(e.value) and "\n" not in str(e.value)


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
