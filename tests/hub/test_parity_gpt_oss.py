"""gpt-oss against transformers eager: learned attention sinks, q/k/v/o biases, sliding windows alternating
with global layers, YaRN RoPE and the top-k MoE with clamped SwiGLU experts. Tiny seeded random configs,
every weight moved off its init (the norms', the sinks' and the experts' too), saved with save_pretrained
and loaded through our public loader: maps (each row summing to 1 - its sink share) and the last hidden
state within 1e-5 in float32, logits close, greedy tokens equal; the rope in both config.json forms; and a
config.json shaped like openai/gpt-oss-20b's (without its quantization_config) loads."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub import test_parity_rotary_families as rotary  # noqa: E402
from tests.hub.test_parity_rotary_families import COMMON, N, TOL, VOCAB, max_differences  # noqa: E402
from tests.tiny_llama import train_tokenizer  # noqa: E402

YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 32, "rope_theta": 1000.0}
GPT_OSS = {**COMMON, "num_hidden_layers": 4, "intermediate_size": 32, "head_dim": 8, "num_local_experts": 4,
           "num_experts_per_tok": 2, "rope_parameters": YARN, "rms_norm_eps": 1e-5}

CASES = {
    # transformers' defaults: sliding on even layers (window 5 < N), YaRN, biases; grouped-query attention
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(num_key_value_heads=2, sliding_window=5)),
    # its own layer pattern, no biases, plain RoPE, every head its own k/v, 3 of 4 experts, swiglu numbers
    "gpt_oss-plain": ("GptOssConfig", "GptOssForCausalLM",
                      dict(num_key_value_heads=6, sliding_window=7, attention_bias=False, num_experts_per_tok=3,
                           layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                           rope_parameters={"rope_type": "default", "rope_theta": 500.0}, swiglu_limit=0.6,
                           swiglu_alpha=1.2, tie_word_embeddings=True)),
}
KINDS = {"gpt_oss": ["local, window 5", "global"] * 2,
         "gpt_oss-plain": ["global", "local, window 7", "local, window 7", "global"]}
WINDOWS = {"gpt_oss": [5, None, 5, None], "gpt_oss-plain": [None, 7, 7, None]}


def make_folder(folder, name: str):
    """rotary.make_folder, then the sinks spread wide (about N(0, 2)): each head's share differs clearly."""
    hf = rotary.make_folder(folder, name, CASES, GPT_OSS, seed=200)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=g) * 2.0)
    hf.save_pretrained(folder, safe_serialization=True)
    return hf


built = rotary.built_fixture(make_folder)


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.family == "gpt_oss" and m.info.causal and m.info.can_generate
    assert list(m.info.layer_kinds) == KINDS[name]
    assert m.module.cfg.sliding_windows == WINDOWS[name]
    assert m.module.cfg.attn_sinks and m.module.cfg.moe.top_k == hf.config.num_experts_per_tok
    ours = rotary.check_parity(hf, m, name, torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(7)))
    share = 1 - ours.attentions.sum(-1)  # (B, L, H, N): what each row gives the sink
    assert (share > -1e-6).all() and (share < 1).all() and share.max() > 0.5  # float32 rows: +-1e-7


def test_the_sinks_and_the_experts_are_seen(built):
    """The parity above depends on each part: the maps leave transformers' without the sinks, and the hidden
    state without the windows."""
    hf, folder = built("gpt_oss")
    m = ax.load_model(str(folder), device="cpu")
    ids = torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(7))
    for layer in m.module.blocks.layers:
        layer.attn.sinks.data.fill_(-1e4)  # a sink no row can reach: a plain softmax
    att, hidden, _ = max_differences(hf, m, ids)
    assert att > 1e-2 and hidden > 1e-3
    m = ax.load_model(str(folder), device="cpu")
    m.module.cfg.sliding_windows = None
    att, hidden, _ = max_differences(hf, m, ids)
    assert att > 1e-2 and hidden > 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_equals_transformers(built, name):
    """Through our KV cache (the fused path, the sink folded in through the lse; windows shorter than
    prompt + new tokens): transformers' greedy tokens."""
    hf, folder = built(name)
    g, steps = rotary.greedy_steps(hf, ax.load_model(str(folder), device="cpu"), max_new_tokens=20)
    assert len(g.prompt_ids) + len(steps) > 7


def _legacy(folder):
    """config.json rewritten in the legacy form: rope_scaling and rope_theta instead of rope_parameters."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    params = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    path.write_text(json.dumps(cfg))
    return cfg


@pytest.mark.parametrize("name", list(CASES))
def test_the_legacy_rope_form_loads_the_same(built, name, tmp_path):
    hf, folder = built(name)
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = _legacy(tmp_path)
    assert "rope_parameters" not in cfg and "rope_scaling" in cfg
    m = ax.load_model(str(tmp_path), device="cpu")
    new = ax.load_model(str(folder), device="cpu").module.cfg
    assert (m.module.cfg.rope_theta, m.module.cfg.rope_scaling) == (new.rope_theta, new.rope_scaling)
    if name == "gpt_oss":
        assert m.module.cfg.rope_scaling.kind == "yarn" and not m.module.cfg.rope_scaling.truncate
    ref = transformers.GptOssForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(8))
    att, hidden, _ = max_differences(ref, m, ids)
    print(f"{name} (legacy rope_scaling): maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL


def test_yarn_is_not_ignored(built):
    """Plain RoPE at the same base instead of YaRN moves the maps away from transformers'."""
    import dataclasses

    from attn_explorer.core.positional import RopeScaling

    hf, folder = built("gpt_oss")
    m = ax.load_model(str(folder), device="cpu")
    m.module.cfg = dataclasses.replace(m.module.cfg, rope_scaling=RopeScaling())
    m.module._rope_cache.clear()
    ids = torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(7))
    att, _, _ = max_differences(hf, m, ids)
    assert att > 1e-3


# ---- part D: a config.json shaped like openai/gpt-oss-20b's -------------------------------------------------

GPT_OSS_20B = dict(  # openai/gpt-oss-20b's config.json, shrunk; its quantization_config (mxfp4) left out
    architectures=["GptOssForCausalLM"], attention_bias=True, attention_dropout=0.0,
    eos_token_id=2,  # real 200002
    experts_per_token=2,  # real 4 (the original code's name, beside num_experts_per_tok)
    head_dim=8,  # real 64
    hidden_act="silu", hidden_size=48,  # real 2880
    initial_context_length=4096, initializer_range=0.02, intermediate_size=32,  # real 2880
    layer_types=["sliding_attention", "full_attention"] * 2,  # real 24 layers, the same alternation
    max_position_embeddings=131072, model_type="gpt_oss", num_attention_heads=6,  # real 64
    num_experts_per_tok=2, num_hidden_layers=4, num_key_value_heads=2,  # real 4, 24, 8
    num_local_experts=4,  # real 32
    output_router_logits=False, pad_token_id=0,  # real 199999
    rms_norm_eps=1e-05,
    rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                  "rope_type": "yarn", "truncate": False},
    rope_theta=150000, router_aux_loss_coef=0.9,
    sliding_window=6,  # real 128
    swiglu_limit=7.0, tie_word_embeddings=False, torch_dtype="bfloat16", transformers_version="4.55.0.dev0",
    use_cache=True, vocab_size=VOCAB)  # real 201088


def _hub_folder(folder, config: dict):
    """config.json as written, next to a tiny bfloat16 state dict under the real tensor names."""
    cfg = transformers.GptOssConfig(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    torch.manual_seed(3)
    hf = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    train_tokenizer().save(str(folder / "tokenizer.json"))


def test_a_gpt_oss_20b_shaped_folder_loads(tmp_path):
    _hub_folder(tmp_path, GPT_OSS_20B)
    m = ax.load_model(str(tmp_path), device="cpu")
    cfg = m.module.cfg
    assert m.info.family == "gpt_oss" and m.info.can_generate and m.info.max_positions == 131072
    assert list(m.info.layer_kinds) == ["local, window 6", "global"] * 2
    assert cfg.rope_theta == 150000 and cfg.rope_scaling.kind == "yarn" and cfg.rope_scaling.factor == 32.0
    assert cfg.rope_scaling.original_positions == 4096 and not cfg.rope_scaling.truncate
    assert cfg.moe.num_experts == 4 and cfg.moe.top_k == 2 and cfg.moe.limit == 7.0 and cfg.moe.alpha == 1.702
    ref = transformers.GptOssForCausalLM.from_pretrained(tmp_path, attn_implementation="eager",
                                                         dtype=torch.float32).eval()
    ids = torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(4))
    att, hidden, _ = max_differences(ref, m, ids)
    print(f"gpt-oss-20b-shaped: maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL
    r = m.run("the cat sat on the mat")
    assert r.sinks is not None and r.sinks.shape == r.attentions.shape[:3]


@pytest.mark.parametrize("change, word", [
    ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"num_local_experts": 0}, "num_local_experts"),
    ({"swiglu_limit": "seven"}, "swiglu_limit"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
    ({"rope_scaling": {"rope_type": "ntk-by-parts"}}, "rope type"),
])
def test_broken_fields_are_one_line(built, tmp_path, change, word):
    _, folder = built("gpt_oss")
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(e.value) and "gpt_oss" in str(e.value) and word in str(e.value)
