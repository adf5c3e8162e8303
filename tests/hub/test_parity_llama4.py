"""Llama 4's language model against transformers eager (Llama4ForCausalLM / Llama4ForConditionalGeneration):
tiny seeded random configs, every weight (the norms' too) moved off its init, saved with save_pretrained and
loaded through our public loader. Chunked attention shorter than the input on the RoPE layers, NoPE layers,
q/k RMS-normalised after RoPE (on and off), temperature tuning of the NoPE layers' queries (floor_scale small
enough to change them), interleaved MoE layers; RoPE in both config forms. Parts C (hooks, lazy, prefix reuse,
interventions, relevance, lens) and D (a config.json shaped like meta-llama/Llama-4-Scout-17B-16E-Instruct's)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis import interventions, lens, relevance, why  # noqa: E402
from attn_explorer.api import prefix  # noqa: E402
from attn_explorer.core import lazy as core_lazy  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity_rotary_families import (COMMON, N, TOL, VOCAB,  # noqa: E402
                                                   check_parity, greedy_steps, max_differences)
from tests.tiny_llama import train_tokenizer  # noqa: E402

COMMON4 = {**COMMON, "num_hidden_layers": 4, "head_dim": 8, "intermediate_size_mlp": 40}
LLAMA3 = dict(rope_type="llama3", rope_theta=1000.0, factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)
PROMPT = "The capital of France is Paris. The capital of Italy"  # 21 tokens: past several chunks

# name -> Llama4TextConfig overrides
CASES = {
    # every layer dense (moe_layers empty), layer 3 NoPE (the default interval), chunks of 5, qk norm, tuning
    "dense": dict(num_key_value_heads=2, attention_chunk_size=5, interleave_moe_layer_step=9, floor_scale=3,
                  attn_scale=0.5, rope_parameters=LLAMA3),
    # MoE on layers 1 and 3 (top-2 of 4 experts), NoPE layers 1 and 3, no qk norm, tuning, chunks of 6
    "moe": dict(num_key_value_heads=3, attention_chunk_size=6, interleave_moe_layer_step=2, num_local_experts=4,
                num_experts_per_tok=2, no_rope_layers=[1, 0, 1, 0], use_qk_norm=False, floor_scale=4, attn_scale=0.7),
    # Scout's kind: every layer MoE (top-1 of 3), qk norm, no temperature tuning, tied head, chunks of 4
    "moe-all": dict(num_key_value_heads=2, attention_chunk_size=4, num_local_experts=3, attn_temperature_tuning=False,
                    tie_word_embeddings=True),
}
KINDS = {
    "dense": ["local, chunk 5"] * 3 + ["global, no positions"],
    "moe": ["local, chunk 6", "global, no positions"] * 2,
    "moe-all": ["local, chunk 4"] * 3 + ["global, no positions"],
}


def _randomised(hf):
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return hf.eval()


def make_folder(folder, name: str, legacy: bool = False):
    """transformers' Llama4ForCausalLM for CASES[name], saved with a trained tokenizer; legacy=True rewrites
    config.json's RoPE the way configs were written before transformers 5 (rope_theta + rope_scaling)."""
    torch.manual_seed(300 + sorted(CASES).index(name))
    hf = _randomised(transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**{**COMMON4, **CASES[name]})))
    hf.save_pretrained(folder, safe_serialization=True)
    train_tokenizer().save(str(folder / "tokenizer.json"))
    if legacy:
        path = folder / "config.json"
        cfg = json.loads(path.read_text())
        params = dict(cfg.pop("rope_parameters"))
        cfg["rope_theta"] = params.pop("rope_theta")
        if params.get("rope_type", "default") != "default":
            cfg["rope_scaling"] = params
        path.write_text(json.dumps(cfg))
    return hf


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(name, legacy=False):
        if (name, legacy) not in cache:
            folder = tmp_path_factory.mktemp(name)
            hf = make_folder(folder, name, legacy)
            cache[name, legacy] = hf, folder, ax.load_model(str(folder), device="cpu")
        return cache[name, legacy]

    return get


def _ids(seed=7):
    return torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(built, name):
    hf, folder, m = built(name)
    assert m.info.family == "llama4_text" and m.info.causal and m.info.can_generate
    assert list(m.info.layer_kinds) == KINDS[name]
    cfg = m.module.cfg
    assert cfg.moe_layers == (None if name == "dense" else [i in hf.config.moe_layers for i in range(4)])
    ours = check_parity(hf, m, name, _ids(), label=f"llama4 {name}")
    chunk = cfg.attention_chunk  # exactly zero outside each query's chunk on the chunked layers
    i, j = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
    shut = (j > i) | (j // chunk != i // chunk)
    for layer, chunked in enumerate(cfg.chunked_layers):
        if chunked:
            assert ours.attentions[:, layer][..., shut].abs().max() == 0
        else:  # a global layer sees across the chunks
            assert ours.attentions[:, layer][..., shut & (j <= i)].abs().max() > 0


def test_the_grid_rows_say_chunk():
    from attn_explorer.session.stacks import short_kind

    assert [short_kind(k) for k in KINDS["moe"]] == ["chunk 6", "global, no positions"] * 2
    assert short_kind("local, window 512") == "local 512"


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_scaling"])
def test_both_rope_config_forms(built, legacy):
    hf, folder, m = built("dense", legacy)
    saved = json.loads((folder / "config.json").read_text())
    assert ("rope_scaling" in saved) == legacy and ("rope_parameters" in saved) != legacy
    assert m.module.cfg.rope_scaling.kind == "llama3" and m.module.cfg.rope_theta == 1000.0
    assert m.module.cfg.rope_layout == "pairs"
    att, hidden, _ = max_differences(hf, m, _ids(3))
    print(f"llama4 dense ({'rope_scaling' if legacy else 'rope_parameters'}): maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_equals_transformers(built, name):
    """20 tokens through our KV cache, crossing chunk boundaries, with the NoPE layers' tuning past the cache."""
    hf, folder, m = built(name)
    g, steps = greedy_steps(hf, m, max_new_tokens=20, prompt=PROMPT)
    assert len(g.prompt_ids) > m.module.cfg.attention_chunk and len(steps) == 20


@pytest.mark.parametrize("switch", ["chunks", "qk norm", "temperature", "pairs"])
def test_each_piece_is_seen_by_the_parity(built, switch):
    """Without any one of Llama 4's pieces the maps leave transformers' (the parity above can fail)."""
    hf, folder, _ = built("dense")
    m = ax.load_model(str(folder), device="cpu")
    cfg = m.module.cfg
    if switch == "chunks":
        cfg.chunked_layers = None
    elif switch == "qk norm":
        for block in m.module.blocks.layers:
            block.attn.qk_rms_after_rope = None
    elif switch == "temperature":
        cfg.temperature_tuning = None
    else:
        for block in m.module.blocks.layers:
            block.attn.rope_layout = "half"
    att, hidden, _ = max_differences(hf, m, _ids())
    assert att > 1e-3 and hidden > 1e-3, (switch, att, hidden)


def test_broken_fields_are_one_line(tmp_path):
    make_folder(tmp_path, "dense")
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    for changes, word in (({"no_rope_layers": [1, 2, 1, 1]}, "no_rope_layers"),
                          ({"attention_chunk_size": 0}, "attention_chunk_size"),
                          ({"layer_types": ["sliding_attention"] * 4}, "sliding_attention"),
                          ({"floor_scale": 0}, "floor_scale"),
                          ({"interleave_moe_layer_step": 0, "moe_layers": None}, "interleave_moe_layer_step"),
                          ({"model_type": "llama4", "text_config": None}, "text_config")):
        path.write_text(json.dumps({**cfg, **changes}))
        with pytest.raises(UserError) as e:
            ax.load_model(str(tmp_path), device="cpu")
        assert "\n" not in str(e.value) and "llama4" in str(e.value) and word in str(e.value), changes


# ---- part C: every view and tool -------------------------------------------------------------------------

def test_routing_is_transformers_router_choice(built):
    """RunResult.routing on the MoE layers: each token's top-2 experts and their sigmoid weights, as
    transformers' router picks them (its router_logits)."""
    hf, _, m = built("moe")
    r = m.run(PROMPT)
    assert r.routing.moe_layers == [1, 3] and r.routing.num_experts == 4
    ids = m.prepare(PROMPT).inputs["input_ids"]
    with torch.no_grad():
        logits = hf(input_ids=ids, output_router_logits=True).router_logits  # one (N, E) per MoE layer
    for layer, lg in zip([1, 3], logits):
        top = lg.float().topk(2, dim=-1)
        np.testing.assert_array_equal(np.sort(r.routing.experts[layer], -1), np.sort(top.indices.numpy(), -1))
        np.testing.assert_allclose(np.sort(r.routing.weights[layer], -1), np.sort(torch.sigmoid(top.values).numpy(), -1),
                                   atol=1e-5)


def test_hooks_exist_and_cache_what_the_run_used(built):
    _, _, m = built("moe")
    names = m.hook_names()
    assert names[:2] == ["hook_embed", "blocks.0.hook_resid_pre"]
    assert "blocks.1.mlp.hook_expert_indices" in names and "blocks.0.mlp.hook_expert_indices" not in names
    r, cache = m.run_with_cache(PROMPT, names=lambda n: n.endswith(("hook_pattern", "hook_q")))
    for layer in range(4):
        np.testing.assert_allclose(cache.numpy(f"blocks.{layer}.attn.hook_pattern")[0], r.attentions[layer], atol=0)
    # hook_q of a NoPE layer is the tuned query: a replacement of it is what the logits read
    t = m.trace(m.prepare(PROMPT), {"blocks.1.attn.hook_q": lambda q, n: q * 0}, attentions=True)
    n = t.out.attentions.shape[-1]
    torch.testing.assert_close(t.out.attentions[0, 1, 0, -1], torch.full((n,), 1.0 / n))


@pytest.mark.parametrize("name,side", [("dense", "right"), ("moe", "right"), ("dense", "left")])
def test_lazy_equals_dense_with_padding_and_the_dk_slider(built, name, side):
    _, _, m = built(name)
    ids = torch.randint(3, 99, (2, 29), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    real = slice(0, 21) if side == "right" else slice(8, 29)
    mask[1] = 0
    mask[1, real] = 1
    inputs = {"input_ids": ids, "attention_mask": mask}
    dense = m.trace(inputs, dk_scale=0.7, dk_layers=[1], attentions=True).out
    t = m.trace(inputs, dk_scale=0.7, dk_layers=[1], lazy=True)
    assert t.out.attentions is None
    for layer in range(4):
        c = t.lazy.layers[layer]
        chunked = m.module.cfg.chunked_layers[layer] and side == "right"  # left padding: a mask of its own
        assert c.options.chunk == (m.module.cfg.attention_chunk if chunked else None)
        for b, rows in ((0, slice(0, 29)), (1, real)):
            for h in range(m.info.num_heads):
                got = core_lazy.head_probs(c.q, c.k, c.lse, c.options, h, batch=b)
                torch.testing.assert_close(got[rows], dense.attentions[b, layer, h][rows], atol=TOL, rtol=1e-5)
    torch.testing.assert_close(t.out.hidden[0], dense.hidden[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(t.out.hidden[1, real], dense.hidden[1, real], atol=1e-5, rtol=1e-5)


def test_prefix_reuse_equals_a_full_recompute(built):
    _, _, m = built("dense")
    prefix.forget()
    try:
        m.run(PROMPT, reuse_prefix=True, hidden=True)
        text = PROMPT + " is Rome, and the capital"
        got = m.run(text, reuse_prefix=True, hidden=True)
        want = m.run(text, hidden=True)
        assert got.reuse.startswith("reused ") and not got.reuse.startswith("reused 0 ")
        np.testing.assert_allclose(got.attentions, want.attentions, atol=1e-5, rtol=0)
        np.testing.assert_allclose(got.hidden, want.hidden, atol=1e-5, rtol=0)
    finally:
        prefix.forget()


def test_interventions_relevance_and_lens_run(built):
    _, _, m = built("moe")
    comparison = interventions.compare(m, PROMPT, {(1, 0): "zero"})
    assert comparison.heads == 1 and comparison.similarity < 1.0
    scan = interventions.ablation_scan(m, PROMPT)
    assert scan.values.shape == (4, m.info.num_heads) and np.isfinite(scan.values).all()
    corrupt = PROMPT.replace("Paris", "Rome ")
    if len(m.prepare(corrupt).tokens) == len(m.prepare(PROMPT).tokens):
        patched = interventions.patch(m, PROMPT, corrupt)
        assert np.isfinite(patched.patched)
    for method in ("gradient_rollout", "attnlrp", "rollout"):
        rel = relevance.explain(m, PROMPT, method)
        assert np.isfinite(np.asarray(rel.scores)).all()
    a = lens.logit_attribution(m, PROMPT)
    assert a.total == pytest.approx(a.logit, abs=1e-3 * max(1.0, abs(a.logit)))
    assert len(lens.logit_lens(m, PROMPT).tokens) == len(m.prepare(PROMPT).tokens)
    from attn_explorer.analysis.flow import contribution_graph

    assert contribution_graph(m, PROMPT) is not None


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_the_why_matrix_adds_up_on_every_layer(built, name):
    """q and k normalised after RoPE (dense) and the NoPE layers' tuned queries (past floor_scale): the writers'
    pieces add up to the logit; a key outside the query's chunk is said to be unseen."""
    _, _, m = built(name)
    chunk = m.module.cfg.attention_chunk
    for layer in range(4):
        w = why.why_matrix(m, PROMPT, None, layer, 1, 14, 11)
        assert abs(w.total - w.logit) < 1e-4 * max(1.0, abs(w.logit)), (layer, w.total, w.logit)
        outside = m.module.cfg.chunked_layers[layer] and 14 // chunk != 11 // chunk
        assert any("chunk" in note for note in w.notes) == outside


# ---- part D: a hub folder as a user has it --------------------------------------------------------------

SCOUT_TEXT = dict(  # meta-llama/Llama-4-Scout-17B-16E-Instruct's text_config, shrunk (48 layers -> 4 ...)
    attention_bias=False, attention_chunk_size=5,  # real 8192
    attention_dropout=0.0, attn_scale=0.1, attn_temperature_tuning=4,  # an int, as in the real file
    bos_token_id=1,  # real 200000
    eos_token_id=[2, 0, 1],  # real [200001, 200007, 200008]
    floor_scale=4,  # real 8192
    for_llm_compressor=False, head_dim=8,  # real 128
    hidden_act="silu", hidden_size=48, initializer_range=0.02, interleave_moe_layer_step=1,
    intermediate_size=24, intermediate_size_mlp=40,  # real 8192, 16384
    max_position_embeddings=10485760, model_type="llama4_text", moe_layers=[0, 1, 2, 3],
    no_rope_layers=[1, 1, 1, 0], num_attention_heads=6, num_experts_per_tok=1, num_hidden_layers=4,
    num_key_value_heads=2, num_local_experts=4,  # real 16
    output_router_logits=False, pad_token_id=0,  # real 200018
    rms_norm_eps=1e-05,
    rope_scaling={"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                  "original_max_position_embeddings": 16,  # real 8192
                  "rope_type": "llama3"},
    rope_theta=500000.0, router_aux_loss_coef=0.001, router_jitter_noise=0.0, torch_dtype="bfloat16",
    use_cache=True, use_qk_norm=True, vocab_size=VOCAB)  # real 202048
SCOUT_VISION = dict(  # its vision_config, shrunk (hidden 1408, 34 layers, image 336)
    attention_dropout=0.0, hidden_act="gelu", hidden_size=16, image_size=28, initializer_range=0.02,
    intermediate_layers_indices=[], intermediate_size=20, model_type="llama4_vision_model",
    multi_modal_projector_bias=False, norm_eps=1e-05, num_attention_heads=2, num_channels=3, num_hidden_layers=1,
    patch_size=14, pixel_shuffle_ratio=0.5, projector_dropout=0.0, projector_input_dim=16, projector_output_dim=16,
    rope_theta=10000, vision_feature_layer=-1, vision_feature_select_strategy="default", vision_output_dim=16)
SCOUT = dict(architectures=["Llama4ForConditionalGeneration"], boi_token_index=3,  # real 200080
             eoi_token_index=4, image_token_index=5,  # real 200081, 200092
             model_type="llama4", text_config=SCOUT_TEXT, tie_word_embeddings=False, torch_dtype="bfloat16",
             transformers_version="4.51.0.dev0", vision_config=SCOUT_VISION)


def test_a_scout_shaped_folder_loads_its_language_model_only(tmp_path):
    keys = [k for k in SCOUT if k not in ("text_config", "vision_config")]
    text = {k: v for k, v in SCOUT_TEXT.items() if k not in ("model_type", "torch_dtype")}
    text["attn_temperature_tuning"] = True  # transformers 5's strict config wants a bool where the file has 4
    vision = {k: v for k, v in SCOUT_VISION.items() if k not in ("model_type", "intermediate_layers_indices")}
    torch.manual_seed(5)
    cfg = transformers.Llama4Config(text_config={**text, "attn_implementation": "eager"}, vision_config=vision,
                                    **{k: SCOUT[k] for k in keys if k.endswith("index")})
    cfg._attn_implementation = "eager"
    hf = _randomised(transformers.Llama4ForConditionalGeneration(cfg))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    (tmp_path / "config.json").write_text(json.dumps(SCOUT))  # the hub's file, not transformers 5's rewrite
    train_tokenizer().save(str(tmp_path / "tokenizer.json"))
    assert any(k.startswith("vision_model.") for k in _saved_keys(tmp_path))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.info.family == "llama4_text" and m.info.can_generate
    assert "vision tower" in m.info.note and "not loaded" in m.info.note
    assert list(m.info.layer_kinds) == ["local, chunk 5"] * 3 + ["global, no positions"]
    lm = hf.language_model.eval()
    lm.config._attn_implementation = "eager"
    att, hidden, _ = max_differences(lm, m, _ids())
    print(f"llama4 scout-shaped: maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL


def _saved_keys(folder) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return list(f.keys())


def test_left_padding_starts_the_chunks_at_the_first_real_token(built):
    """transformers counts a row's chunks from its first real token (left padding shifts them): so do we."""
    hf, _, m = built("dense")
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        ref = hf.model(input_ids=ids, attention_mask=mask, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, attention_mask=mask, output_attentions=True)
    for layer, a in enumerate(ref.attentions):
        torch.testing.assert_close(ours.attentions[:, layer, :, 3:], a[:, :, 3:], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden[:, 3:], ref.last_hidden_state[:, 3:], atol=TOL, rtol=0)
