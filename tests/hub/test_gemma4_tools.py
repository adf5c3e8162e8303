"""Part C of issue 23 on Gemma 4: the hooks (a KV-sharing layer's hook_k / hook_v are the keys and values it
reads), lazy attention, prefix reuse, head ablation and patching, every relevance method, MoE routing in the run;
the logit lens, contributions and why-this-head refuse it in one line (its layer scalars and per-layer inputs act
outside the pieces they sum). The tiny models are tests/hub/test_parity_gemma4.py's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.gemma4")

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis import interventions, lens  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity_gemma4 import make_folder  # noqa: E402
from tests.hub.test_parity_rotary_families import folders  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return folders(tmp_path_factory, make_folder)


# ---- part C: hooks, lazy attention, prefix reuse, interventions, the analyses -------------------------------

TEXT = "the cat sat on the mat and the dog ran to the park"


def test_hooks_exist_and_a_shared_layer_sees_the_keys_it_reads(built):
    _, folder = built("k_eq_v-shared-ple")
    m = ax.load_model(str(folder), device="cpu")
    names = m.hook_names()
    assert "blocks.5.attn.hook_k" in names and "blocks.5.attn.hook_pattern" in names
    r, cache = m.run_with_cache(TEXT)
    assert torch.equal(cache["blocks.5.attn.hook_k"], cache["blocks.2.attn.hook_k"])  # layer 5 reads layer 2's keys
    assert cache["blocks.2.attn.hook_q"].shape[-1] == 16 and cache["blocks.0.attn.hook_q"].shape[-1] == 8
    np.testing.assert_allclose(cache["blocks.3.attn.hook_pattern"][0].numpy(), r.attentions[3], atol=1e-6)

    def zero_layer2_values(v, name):
        return torch.zeros_like(v)

    r2 = m.run_with_hooks(TEXT, {"blocks.2.attn.hook_v": zero_layer2_values})
    assert np.abs(r2.attentions[5] - r.attentions[5]).max() > 0  # layer 5 sees what layer 2 made


def test_lazy_attention_equals_the_dense_maps(built):
    _, folder = built("k_eq_v-shared-ple")
    m = ax.load_model(str(folder), device="cpu")
    dense = m.run(TEXT)
    lazy = m.run(TEXT, lazy=True)
    for layer in range(dense.attentions.shape[0]):
        for head in range(dense.attentions.shape[1]):
            np.testing.assert_allclose(lazy.attention(layer, head), dense.attentions[layer, head], atol=1e-5,
                                       rtol=1e-4)  # unscaled logits: the flash kernel rounds a little apart


def test_prefix_reuse_equals_a_fresh_run(built):
    _, folder = built("k_eq_v-shared-ple")
    m = ax.load_model(str(folder), device="cpu")
    m.run(TEXT, reuse_prefix=True)
    edited = TEXT.replace("park", "house")
    again = m.run(edited, reuse_prefix=True)  # the KV cache (shared slots included) cut at the edit, the rest run
    assert again.reuse.startswith("reused"), again.reuse
    fresh = ax.load_model(str(folder), device="cpu").run(edited)
    np.testing.assert_allclose(again.attentions, fresh.attentions, atol=1e-6)


def test_head_ablation_changes_the_next_token_distribution(built):
    _, folder = built("k_eq_v-shared-ple")
    m = ax.load_model(str(folder), device="cpu")
    c = interventions.compare(m, TEXT, {(2, 1): "zero"})
    assert c.kind == "decoder" and c.heads == 1 and np.abs(c.after - c.before).max() > 1e-4
    with m.hooks({"blocks.2.attn.hook_z": lambda z, name: torch.zeros_like(z)}):  # every head of layer 2: the
        zeroed = m.run(TEXT)  # maps of the layers after it move, layer 5 (reading layer 2's keys) too
    clean = m.run(TEXT)
    assert np.abs(zeroed.attentions[2] - clean.attentions[2]).max() == 0
    assert np.abs(zeroed.attentions[5] - clean.attentions[5]).max() > 0


def test_the_logit_lens_refuses_gemma4_in_one_line(built):
    """Per-layer inputs and layer scalars sit outside the pieces the lens / contributions sum."""
    _, folder = built("k_eq_v-ple")
    m = ax.load_model(str(folder), device="cpu")
    with pytest.raises(UserError) as e:
        lens.logit_attribution(m, TEXT)
    assert "\n" not in str(e.value) and "Gemma 4" in str(e.value)


def test_moe_routing_is_transformers_and_reaches_the_run(built):
    """The MoE layers' chosen experts and weights (RunResult.routing, the routing hooks) are those transformers'
    router picks; lazy runs record the same routing."""
    hf, folder = built("moe")
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.moe_layers == (True,) * 4 and m.info.num_experts == 4 and m.info.experts_per_token == 2
    ids = m.prepare(TEXT).inputs["input_ids"]
    seen = {}
    handles = [layer.router.register_forward_hook(lambda mod, a, out, i=i: seen.__setitem__(i, out))
               for i, layer in enumerate(hf.model.layers)]
    with torch.no_grad():
        hf.model(input_ids=ids)
    for h in handles:
        h.remove()
    r = m.run(TEXT)
    for i in range(4):
        _, weights, index = seen[i]
        np.testing.assert_array_equal(r.routing.experts[i], index.numpy())
        np.testing.assert_allclose(r.routing.weights[i], weights.float().numpy(), atol=1e-6)
    lazy = m.run(TEXT, lazy=True)
    np.testing.assert_array_equal(lazy.routing.experts[2], r.routing.experts[2])


@pytest.mark.parametrize("name", ["k_eq_v-shared-ple", "moe"])
def test_relevance_methods_and_patching_run(built, name):
    """Every relevance method gives one finite score per token; the patching scan fills its L x H grid, and
    patching a run with itself changes nothing."""
    from attn_explorer.analysis.relevance import METHODS, explain

    _, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    n = len(m.prepare(TEXT).tokens)
    for method in METHODS:
        r = explain(m, TEXT, method=method)
        assert r.scores.shape == (n,) and np.isfinite(r.scores).all(), method
    scan = interventions.patching_scan(m, TEXT, TEXT)
    assert scan.values.shape == (m.info.num_layers, m.info.num_heads)
    np.testing.assert_allclose(scan.values, scan.values[0, 0], atol=1e-5)


def test_why_this_head_refuses_gemma4_in_one_line(built):
    from attn_explorer.analysis import why

    _, folder = built("dense")
    m = ax.load_model(str(folder), device="cpu")
    with pytest.raises(UserError) as e:
        why.why_matrix(m, TEXT, None, 0, 0, 3, 1)
    assert "\n" not in str(e.value) and "Gemma 4" in str(e.value)


def test_a_sharing_layers_grid_row_label_stays_short():
    from attn_explorer.session.stacks import short_kind

    assert short_kind("local, window 512, keys and values of layer 13") == "local 512, k/v of L13"
    assert short_kind("global, keys and values of layer 14") == "global, k/v of L14"
