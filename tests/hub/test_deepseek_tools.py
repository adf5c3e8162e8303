"""Every view and tool on DeepSeek-V3 (issue 23 part C) and a config.json shaped like deepseek-ai/DeepSeek-V3's
(part D): the hooks (d_v ≠ d_qk), lazy attention keeping the latent instead of every head's k, prefix reuse,
ablation equal to transformers with W_O's input zeroed, patching, the relevance methods and the lens run;
why-this-head refuses in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis import interventions, lens, relevance, why  # noqa: E402
from attn_explorer.core.mla import LatentKeys  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity_deepseek import make_folder  # noqa: E402
from tests.hub.test_parity_moe import _hf_routing  # noqa: E402
from tests.hub.test_parity_rotary_families import TOL, max_differences  # noqa: E402
from tests.tiny_llama import train_tokenizer  # noqa: E402

TEXT = "the cat sat on the mat and the dog ran"
OTHER = "the dog sat on the mat and the cat ran"
H, D_QK, D_V = 6, 12, 10  # test_parity_deepseek's COMMON: 6 heads, d_qk = 8 + 4, d_v = 10


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp("deepseek-tools")
            hf = make_folder(folder, name)
            cache[name] = (hf, ax.load_model(str(folder), device="cpu"))
        return cache[name]
    return get


@pytest.mark.parametrize("name", ["q-latent, interleaved", "moe"])
def test_the_hooks_exist_with_their_widths(load, name):
    _, m = load(name)
    names = m.hook_names()
    assert all(f"blocks.{i}.attn.hook_{p}" in names for i in range(3) for p in ("q", "k", "v", "pattern", "z"))
    r, cache = m.run_with_cache(TEXT)
    n = len(r.tokens)
    assert tuple(cache["blocks.1.attn.hook_q"].shape) == tuple(cache["blocks.1.attn.hook_k"].shape) == (1, n, H, D_QK)
    assert tuple(cache["blocks.1.attn.hook_v"].shape) == tuple(cache["blocks.1.attn.hook_z"].shape) == (1, n, H, D_V)
    np.testing.assert_array_equal(cache["blocks.2.attn.hook_pattern"][0].float().numpy(), r.attentions[2])
    inputs = {"input_ids": torch.tensor([m.prepare(TEXT).inputs["input_ids"][0].tolist()])}
    t = m.trace(inputs, attentions=True)
    off = m.trace(inputs, {"blocks.2.attn.hook_z": lambda z, n: torch.zeros_like(z)}, attentions=True)
    torch.testing.assert_close(off.out.attentions, t.out.attentions, atol=0, rtol=0)
    assert (off.out.hidden - t.out.hidden).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["q-latent, interleaved", "plain q, half rope", "moe"])
def test_lazy_keeps_the_latent_and_every_map_is_the_dense_one(load, name):
    _, m = load(name)
    ids = torch.randint(3, 300, (2, 29), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 21:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    dense = m.trace(inputs, dk_scale=0.7, dk_layers=[1], attentions=True).out
    t = m.trace(inputs, dk_scale=0.7, dk_layers=[1], lazy=True)
    from attn_explorer.core import lazy as core_lazy

    for layer, kept in enumerate(t.lazy.layers):
        assert isinstance(kept.k, LatentKeys)
        assert kept.k.numel() == 2 * 29 * (16 + 4)  # the latent (kv_lora_rank 16) and the shared k_rope (4)
        for b, rows in ((0, 29), (1, 21)):
            for h in range(H):
                got = core_lazy.head_probs(kept.q, kept.k, kept.lse, kept.options, h, batch=b)
                torch.testing.assert_close(got[:rows], dense.attentions[b, layer, h, :rows], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(t.out.hidden[0], dense.hidden[0], atol=1e-5, rtol=1e-5)
    # per token and layer: 20 numbers kept instead of every head's key (6 × 12): 80 bytes instead of 288 (3.6x)
    cfg = m.module.cfg.mla
    assert (cfg.latent_bytes(4), cfg.per_head_key_bytes(H, 4)) == (80, 288)
    r, d = m.run(TEXT, lazy=True), m.run(TEXT)
    np.testing.assert_allclose(r.attention(2, 3), d.attentions[2, 3], atol=1e-6, rtol=1e-5)
    assert "latent" in m.info.note


def test_a_hook_that_replaces_k_makes_lazy_keep_every_heads_k(load):
    _, m = load("q-latent, interleaved")
    inputs = {"input_ids": torch.tensor([m.prepare(TEXT).inputs["input_ids"][0].tolist()])}
    hooks = {"blocks.1.attn.hook_k": lambda k, n: k * 1.5}
    dense = m.trace(inputs, hooks, attentions=True).out
    t = m.trace(inputs, hooks, lazy=True)
    assert isinstance(t.lazy.layers[0].k, LatentKeys) and isinstance(t.lazy.layers[1].k, torch.Tensor)
    np.testing.assert_allclose(t.lazy.attention(1, 2), dense.attentions[0, 1, 2].numpy(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("lazy", [False, True])
def test_prefix_reuse_gives_the_fresh_run(load, lazy):
    _, m = load("moe")
    m.run(TEXT, reuse_prefix=True, lazy=lazy)
    again = m.run(TEXT + " home", reuse_prefix=True, lazy=lazy)
    fresh = m.run(TEXT + " home")
    for layer in range(3):
        for h in range(H):
            np.testing.assert_allclose(again.attention(layer, h), fresh.attentions[layer, h], atol=1e-6, rtol=1e-5)


def test_ablation_equals_transformers_with_w_os_input_zeroed(load):
    hf, m = load("moe")
    prep = m.prepare(TEXT)
    ids = torch.tensor([prep.inputs["input_ids"][0].tolist()])

    def zero_head_2(module, args):
        x = args[0].clone()
        x[..., 2 * D_V:3 * D_V] = 0
        return (x,)

    handle = hf.model.layers[1].self_attn.o_proj.register_forward_pre_hook(zero_head_2)
    try:
        with torch.no_grad():
            ref = hf.model(input_ids=ids, output_attentions=True)
    finally:
        handle.remove()
    r = m.run(TEXT, ablate={(1, 2): "zero"}, hidden=True)
    assert np.abs(r.hidden - ref.last_hidden_state[0].numpy()).max() <= TOL
    assert np.abs(r.attentions[2] - ref.attentions[2][0].numpy()).max() <= TOL


def test_patching_relevance_and_the_lens_run(load):
    _, m = load("moe")
    scan = interventions.patching_scan(m, TEXT, OTHER)
    assert scan.values.shape == (3, H) and np.isfinite(scan.values).all()
    p = interventions.patch(m, TEXT, OTHER, heads=[(1, 2)])
    assert np.isfinite([p.clean, p.corrupt, p.patched]).all()
    n = len(m.prepare(TEXT).tokens)
    for method in ("gradient_rollout", "attnlrp", "rollout", "attention"):
        rel = relevance.explain(m, TEXT, method=method)
        assert rel.scores.shape == (n,) and np.isfinite(rel.scores).all(), method
    a = lens.logit_attribution(m, TEXT)
    assert a.total == pytest.approx(a.logit, abs=1e-3 * max(1.0, abs(a.logit)))
    assert len(lens.logit_lens(m, TEXT).tokens) == n


def test_why_this_head_refuses_in_one_line(load):
    _, m = load("q-latent, interleaved")
    with pytest.raises(UserError, match="deepseek_v3") as e:
        why.why_matrix(m, TEXT, None, 1, 0, 6, 2)
    assert "\n" not in str(e.value) and "latent" in str(e.value)


# ---- part D: a folder as deepseek-ai/DeepSeek-V3 ships it (its config.json's keys, shrunk; bf16 shards) --------

REAL = {  # deepseek-ai/DeepSeek-V3's config.json, its widths and counts shrunk, without quantization_config
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 48, "initializer_range": 0.02, "intermediate_size": 64, "kv_lora_rank": 16,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 24, "moe_layer_freq": 1,
    "n_group": 4, "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 6,
    "num_experts_per_tok": 3, "num_hidden_layers": 3, "num_key_value_heads": 6, "num_nextn_predict_layers": 1,
    "pretraining_tp": 1, "q_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 2, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3", "use_cache": True, "v_head_dim": 10, "vocab_size": 300,
}


def _hub_folder(folder):
    """REAL's config.json and two bf16 safetensors shards with an index, the second holding the multi-token-
    prediction layer (layer 3 = num_hidden_layers, as DeepSeek-V3's is 61) that the model itself does not use."""
    from safetensors.torch import save_file

    keys = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
            "first_k_dense_replace", "num_attention_heads", "num_key_value_heads", "kv_lora_rank", "q_lora_rank",
            "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "n_group", "topk_group",
            "num_experts_per_tok", "n_shared_experts", "routed_scaling_factor", "rms_norm_eps")
    torch.manual_seed(5)
    hf = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**{k: REAL[k] for k in keys}))
    sd = {}
    for k, v in hf.state_dict().items():  # the experts one Linear each, as the hub's checkpoints (and save_pretrained)
        v = (v + torch.randn_like(v) * 0.1).to(torch.bfloat16)
        if k.endswith("experts.gate_up_proj"):
            for e, w in enumerate(v):
                sd[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = w[:24].contiguous()
                sd[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = w[24:].contiguous()
        elif k.endswith("experts.down_proj"):
            sd.update({k.replace("down_proj", f"{e}.down_proj.weight"): w.contiguous() for e, w in enumerate(v)})
        else:
            sd[k] = v.contiguous()
    mtp = {k.replace("layers.2.", "layers.3."): v.clone() for k, v in sd.items() if k.startswith("model.layers.2.")}
    mtp.update({f"model.layers.3.{n}": torch.ones(48, dtype=torch.bfloat16) for n in ("enorm.weight", "hnorm.weight")})
    mtp["model.layers.3.eh_proj.weight"] = torch.zeros(48, 96, dtype=torch.bfloat16)
    mtp["model.layers.3.shared_head.head.weight"] = torch.zeros(300, 48, dtype=torch.bfloat16)
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    save_file(sd, str(folder / names[0]), metadata={"format": "pt"})
    save_file(mtp, str(folder / names[1]), metadata={"format": "pt"})
    index = {"metadata": {"total_size": 0}, "weight_map": {**{k: names[0] for k in sd}, **{k: names[1] for k in mtp}}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(json.dumps(REAL))
    train_tokenizer().save(str(folder / "tokenizer.json"))


def test_a_folder_shaped_like_deepseek_v3s_loads_and_equals_transformers(tmp_path):
    _hub_folder(tmp_path)
    m = ax.load_model(str(tmp_path), device="cpu")
    cfg = m.module.cfg
    assert m.info.family == "deepseek_v3" and m.info.num_layers == 3 and m.info.can_generate
    assert cfg.rope_scaling.kind == "yarn" and cfg.rope_scaling.factor == 40 and cfg.rope_layout == "pairs_in"
    assert cfg.moe_layers == [False, True, True] and cfg.mla.q_lora_rank == 12
    hf = transformers.DeepseekV3ForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    ids = torch.randint(3, 300, (2, 23), generator=torch.Generator().manual_seed(7))
    att, hidden, _ = max_differences(hf, m, ids)
    print(f"deepseek_v3 hub-shaped folder: maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL


def test_routing_is_transformers_choice(load):
    """RunResult.routing on the MoE layers: each token's experts and weights as DeepseekV3TopkRouter chose them
    (group-limited, the correction bias choosing only, renormalised and scaled); None on the dense layer 0."""
    hf, m = load("moe")
    r = m.run(TEXT)
    ids = torch.tensor([m.prepare(TEXT).inputs["input_ids"][0].tolist()])
    seen = _hf_routing(hf, ids)
    assert r.routing.experts[0] is None
    for i in (1, 2):
        experts, weights = seen[i]
        order = experts.argsort(dim=-1)
        ours_order = np.argsort(r.routing.experts[i], axis=-1)
        np.testing.assert_array_equal(np.take_along_axis(r.routing.experts[i], ours_order, -1),
                                      experts.gather(-1, order).numpy())
        np.testing.assert_allclose(np.take_along_axis(r.routing.weights[i], ours_order, -1),
                                   weights.gather(-1, order).numpy(), atol=1e-6, rtol=1e-5)


def test_the_long_input_statistics_read_latent_keys(load, monkeypatch):
    """analysis.long's tiled head statistics and one rollout row, from the kept latent: the dense numbers."""
    from attn_explorer.analysis import long
    from attn_explorer.analysis.rollout import attention_rollout
    from attn_explorer.analysis.stats import head_stats

    monkeypatch.setattr(long, "TILE_ELEMENTS", 6 * 8 * 29)  # many row tiles a layer
    _, m = load("moe")
    inputs = {"input_ids": torch.randint(3, 300, (1, 29), generator=torch.Generator().manual_seed(4))}
    with torch.inference_mode():
        att = m.module(output_attentions=True, **inputs).attentions[0].float().numpy()
    layers = long.collect_layers(m.module, inputs)
    assert all(isinstance(layer.k, LatentKeys) for layer in layers)
    special = np.zeros(29, dtype=bool)
    special[[0, 9]] = True
    want, got = head_stats(att, special), long.tiled_head_stats(layers, special)
    for stat in ("entropy", "sink", "distance", "prev", "next"):
        np.testing.assert_allclose(got.get(stat), want.get(stat), atol=1e-5, rtol=0, err_msg=stat)
    np.testing.assert_allclose(long.rollout_row(layers, 28, "mean"), attention_rollout(att, "mean")[28], atol=1e-5)
