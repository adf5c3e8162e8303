"""gpt-oss through the public API and the tools (issue 23 part C): the sink's share beside the maps
(RunResult.sinks, dense and lazy), the hooks, lazy attention, prefix reuse, ablation (against transformers
with the same heads switched off), patching, the lens, the why-matrix, relevance and export / reopen."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.core.hooks import BLOCK_POINTS  # noqa: E402
from tests.hub.test_parity_gpt_oss import make_folder  # noqa: E402

TEXT = "The capital of France is Paris. Attention lets every token look at the tokens before it."
OTHER = "The capital of France is Paris. Attention lets every token look at the words after it."
SWAPPED = "The capital of Paris is France. Attention lets every token look at the tokens before it."
ATOL, RTOL = 1e-6, 1e-5  # lazy (torch's flash kernel) against dense (explicit softmax), as tests/api/test_lazy.py


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt_oss")
    hf = make_folder(folder, "gpt_oss")
    return hf, ax.load_model(str(folder), device="cpu")


def test_the_sinks_share_travels_beside_the_maps(tiny):
    _, m = tiny
    r = m.run(TEXT)
    L, H, N, _ = r.attentions.shape
    assert r.sinks.shape == (L, H, N) and r.sinks.dtype == np.float32
    np.testing.assert_allclose(r.sinks, 1 - r.attentions.sum(-1, dtype=np.float64), atol=1e-6)
    assert (r.sinks >= 0).all() and (r.sinks < 1).all() and r.sinks.max() > 0.3
    lazy = m.run(TEXT, lazy=True)
    assert lazy.is_lazy
    np.testing.assert_allclose(lazy.sinks, r.sinks, atol=ATOL, rtol=RTOL)  # from the kept lse: exp(sink - lse)
    for layer, head in ((0, 0), (1, 5), (3, 2)):  # a window layer and a global one
        np.testing.assert_allclose(lazy.attention(layer, head), r.attentions[layer, head], atol=ATOL, rtol=RTOL)


def test_a_model_without_sinks_has_none(tmp_path):
    from tests.tiny_llama import make_llama_folder

    assert ax.load_model(str(make_llama_folder(tmp_path)), device="cpu").run("the cat sat").sinks is None


def test_the_hooks_exist_and_the_pattern_is_the_map_without_its_sink(tiny):
    _, m = tiny
    names = m.hook_names()
    for i in range(m.info.num_layers):
        assert all(f"blocks.{i}.{p}" in names for p in BLOCK_POINTS)
    r, cache = m.run_with_cache(TEXT)
    pattern = cache["blocks.1.attn.hook_pattern"][0].float().numpy()
    np.testing.assert_allclose(pattern, r.attentions[1], atol=1e-7)
    np.testing.assert_allclose(1 - pattern.sum(-1), r.sinks[1], atol=1e-6)
    z = cache["blocks.2.attn.hook_z"]
    assert z.shape == (1, r.num_tokens, m.info.num_heads, 8)


def test_prefix_reuse_gives_a_fresh_runs_maps_and_sinks(tiny):
    _, m = tiny
    for lazy in (False, True):
        m.run(TEXT, reuse_prefix=True, lazy=lazy)
        again = m.run(OTHER, reuse_prefix=True, lazy=lazy)
        assert again.reuse.startswith("reused") and not again.reuse.startswith("reused 0 ")
        fresh = m.run(OTHER, lazy=lazy)
        np.testing.assert_allclose(again.sinks, fresh.sinks, atol=ATOL, rtol=RTOL)
        for layer in range(m.info.num_layers):
            np.testing.assert_allclose(again.attention(layer, 3), fresh.attention(layer, 3), atol=ATOL, rtol=RTOL)


def test_ablation_equals_transformers_with_the_same_heads_off(tiny):
    """Heads 1 of layer 0 (a window layer) and 4 of layer 1 zeroed before W_O, on both sides."""
    hf, m = tiny
    d = 8
    ablate = {(0, 1): "zero", (1, 4): "zero"}

    def off(head):
        def hook(_module, args):
            x = args[0].clone()
            x[..., head * d:(head + 1) * d] = 0.0
            return (x, *args[1:])
        return hook

    r = m.run(TEXT, ablate=ablate, hidden=True)
    ids = torch.tensor([m.tokenizer.encode(TEXT, 10_000).ids])
    handles = [hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(off(head))
               for (layer, head) in ablate]
    try:
        with torch.no_grad():
            ref = hf.model(input_ids=ids, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    maps = max(float(np.abs(r.attentions[i] - a[0].numpy()).max()) for i, a in enumerate(ref.attentions))
    hidden = float(np.abs(r.hidden - ref.last_hidden_state[0].numpy()).max())
    print(f"gpt_oss ablation: maps {maps:.2e} hidden {hidden:.2e}")
    assert maps <= 1e-5 and hidden <= 1e-5
    plain = m.run(TEXT)
    assert np.abs(plain.attentions[2:] - r.attentions[2:]).max() > 1e-4  # the ablation is seen downstream
    assert np.abs(plain.sinks[2:] - r.sinks[2:]).max() > 1e-5


def test_patching_every_head_restores_the_clean_run(tiny):
    from attn_explorer.analysis import interventions as iv

    _, m = tiny
    p = iv.patch(m, TEXT, SWAPPED)
    assert abs(p.clean - p.corrupt) > 1e-4
    assert p.patched == pytest.approx(p.clean, abs=1e-5)


def test_the_decomposing_analyses_add_up(tiny):
    """The lens's pieces and the why-matrix's pieces add up to the logit (the sink adds no value, so no piece)."""
    from attn_explorer.analysis import lens, why

    _, m = tiny
    a = lens.logit_attribution(m, TEXT)
    assert a.total == pytest.approx(a.logit, abs=1e-3 * max(1.0, abs(a.logit)))
    assert len(lens.logit_lens(m, TEXT).tokens) == len(m.prepare(TEXT).tokens)
    for layer in (0, 1):  # a window layer and a global one
        w = why.why_matrix(m, TEXT, None, layer, 2, 5, 3)
        assert abs(w.total - w.logit) < 1e-4


@pytest.mark.parametrize("method", ["gradient_rollout", "attnlrp", "rollout"])
def test_relevance_runs_through_the_sinks_and_the_experts(tiny, method):
    from attn_explorer.analysis.relevance import explain

    _, m = tiny
    r = explain(m, TEXT, method=method)
    assert r.scores.shape == (len(m.prepare(TEXT).tokens),) and np.isfinite(r.scores).all()
    assert np.abs(r.scores).max() > 0


def test_export_writes_the_sinks_and_reopen_reads_them(tiny, tmp_path):
    from attn_explorer.cli.export import chosen_arrays
    from attn_explorer.files import save_npz
    from attn_explorer.session.reopen import read_run

    _, m = tiny
    r = m.run(TEXT)
    path = save_npz(r, tmp_path / "run.npz")
    with np.load(path) as d:
        np.testing.assert_array_equal(d["sinks"], r.sinks)
    np.testing.assert_array_equal(read_run(str(path)).result.sinks, r.sinks)
    chosen = chosen_arrays(m.run(TEXT, lazy=True), {"layers": [1, 3], "heads": [0, 4], "pool": 8})
    np.testing.assert_allclose(chosen["sinks"], r.sinks[np.ix_([1, 3], [0, 4])], atol=ATOL, rtol=RTOL)


def test_the_routing_is_transformers_router(tiny):
    """RunResult.routing on gpt-oss: each token's top-k experts of transformers' router logits (highest first) and
    the softmax over those k logits as their weights."""
    hf, m = tiny
    r = m.run(TEXT)
    ids = torch.tensor([m.tokenizer.encode(TEXT, 10_000).ids])
    with torch.no_grad():
        logits = hf(input_ids=ids, output_router_logits=True).router_logits
    k = m.info.experts_per_token
    for layer, lg in enumerate(logits):
        top, idx = lg.float().topk(k, dim=-1)
        np.testing.assert_array_equal(r.routing.experts[layer], idx.numpy())
        np.testing.assert_allclose(r.routing.weights[layer], torch.softmax(top, -1).numpy(), atol=1e-5)
