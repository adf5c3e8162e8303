"""Issue 23 part C on GLM-4, Cohere and Cohere 2: the hooks of the fourth pass, lazy attention, prefix reuse,
the interventions (ablation, patching), relevance, the logit lens and attribution, why-this-head and the
contribution graph work on each, and agree with the dense run (or the model's own logits) where they should.
Cohere's logit_scale multiplies the logits the lens and attribution read, as it does the model's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from attn_explorer.analysis import interventions, lens, relevance, why  # noqa: E402
from attn_explorer.api import prefix  # noqa: E402
from tests.hub.test_parity_glm_cohere import make_folder  # noqa: E402
from tests.hub.test_parity_rotary_families import loaded  # noqa: E402

TOL = 1e-5
TEXT = "The capital of France is Paris. Attention lets every token look at the tokens before it"
FAMILIES = ["glm4", "cohere2", "cohere", "cohere-qknorm"]


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    return loaded(tmp_path_factory, make_folder)


@pytest.fixture(autouse=True)
def nothing_kept():
    prefix.forget()
    yield
    prefix.forget()


@pytest.mark.parametrize("name", FAMILIES)
def test_hooks_exist_and_the_cache_is_the_run(load, name):
    m = load(name)
    names = m.hook_names()
    L = m.info.num_layers
    for i in range(L):
        for point in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "hook_resid_post", "attn.hook_pattern",
                      "attn.hook_z"):
            assert f"blocks.{i}.{point}" in names
    r, cache = m.run_with_cache(TEXT)
    for i in range(L):
        np.testing.assert_allclose(cache[f"blocks.{i}.attn.hook_pattern"][0].numpy(), r.attentions[i], atol=TOL)
        # a parallel block (Cohere) and a sandwich one (GLM-4) alike: the stream is the sum of its pieces
        total = cache[f"blocks.{i}.hook_resid_pre"] + cache[f"blocks.{i}.hook_attn_out"] + \
            cache[f"blocks.{i}.hook_mlp_out"]
        torch.testing.assert_close(total, cache[f"blocks.{i}.hook_resid_post"], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_zeroing_a_head_through_hook_z_is_the_ablation(load, name):
    m = load(name)

    def zero(z, hook_name):
        z[:, :, 2] = 0
        return z

    hooked = m.run_with_hooks(TEXT, {"blocks.1.attn.hook_z": zero}, hidden=True)
    plain = m.run(TEXT, hidden=True)
    assert np.abs(hooked.hidden - plain.hidden).max() > 1e-4
    with torch.inference_mode():
        after = torch.softmax(m.module.logits(torch.from_numpy(hooked.hidden[-1])).float(), -1).numpy()
    c = interventions.compare(m, TEXT, {(1, 2): "zero"})  # the ablation page's two runs in one pass
    assert c.kind == "decoder" and c.heads == 1
    np.testing.assert_allclose(np.sort(c.after)[::-1][:3], np.sort(after)[::-1][:3], atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_lazy_attention_equals_the_dense_maps(load, name):
    m = load(name)
    dense, store = m.run(TEXT), m.run(TEXT, lazy=True)
    assert store.is_lazy
    L, H = dense.attentions.shape[:2]
    for layer in range(L):
        for head in range(H):
            np.testing.assert_allclose(store.attention(layer, head), dense.attentions[layer, head], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_prefix_reuse_equals_a_full_recompute(load, name):
    """Cohere 2: the prompt is longer than its windows of 5, and the edit comes after them."""
    m = load(name)
    m.run(TEXT, reuse_prefix=True)
    got = m.run(TEXT + " again", reuse_prefix=True, hidden=True)
    want = m.run(TEXT + " again", hidden=True)
    assert got.reuse.startswith("reused ") and not got.reuse.startswith("reused 0")
    np.testing.assert_allclose(got.attentions, want.attentions, atol=TOL, rtol=0)
    np.testing.assert_allclose(got.hidden, want.hidden, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_ablation_and_patching_scans(load, name):
    m = load(name)
    scan = interventions.ablation_scan(m, TEXT)
    assert scan.values.shape == (m.info.num_layers, m.info.num_heads) and np.isfinite(scan.values).all()
    clean, corrupt = "the cat sat on the mat and the dog", "the dog sat on the mat and the cat"
    patched = interventions.patching_scan(m, clean, corrupt)
    assert np.isfinite(patched.values).all() and patched.corrupt is not None
    one = interventions.patch(m, clean, corrupt, heads=[(1, 2)])  # a scan's cell is the single patch
    assert one.patched == pytest.approx(float(patched.values[1, 2]), abs=1e-5)


@pytest.mark.parametrize("method", relevance.METHODS)
@pytest.mark.parametrize("name", FAMILIES)
def test_relevance_methods_run(load, name, method):
    r = relevance.explain(load(name), TEXT, method=method)
    assert r.scores.shape == (len(r.tokens),) and np.isfinite(r.scores).all()


@pytest.mark.parametrize("name", FAMILIES)
def test_attribution_and_lens_read_the_models_own_logits(load, name):
    """The pieces add up to the logit, and that logit is the model's (Cohere's times logit_scale), its
    probability the model's softmax; the lens's last layer is the model's own next-token distribution."""
    m = load(name)
    a = lens.logit_attribution(m, TEXT)
    assert a.total == pytest.approx(a.logit, abs=1e-4 * max(1.0, abs(a.logit)))
    r = m.run(TEXT, hidden=True)
    with torch.inference_mode():
        logits = m.module.logits(torch.from_numpy(r.hidden[-1])).float()
    assert int(logits.argmax()) == a.target_id
    assert a.logit == pytest.approx(float(logits[a.target_id]), abs=1e-4)
    assert a.prob == pytest.approx(float(torch.softmax(logits, -1)[a.target_id]), abs=1e-5)
    table = lens.logit_lens(m, TEXT)
    assert table.top_probs[-1, -1, 0] == pytest.approx(float(torch.softmax(logits, -1).max()), abs=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_why_this_head_adds_up_on_every_layer(load, name):
    """GLM-4's interleaved partial RoPE, Cohere 2's global layers without RoPE: the split is the real logit."""
    m = load(name)
    for layer in range(m.info.num_layers):
        w = why.why_matrix(m, TEXT, None, layer, 1, 6, 2)
        assert abs(w.total - w.logit) < 1e-4, (layer, w.total, w.logit)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_contribution_graph_runs(load, name):
    from attn_explorer.analysis.flow import contribution_graph

    assert contribution_graph(load(name), TEXT) is not None
