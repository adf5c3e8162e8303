"""GLM-4 (sandwich norms, interleaved partial RoPE, q/k/v biases, fused gate_up), Cohere (Command R: one
bias-free LayerNorm read by both parallel branches, interleaved RoPE, logit_scale) and Cohere 2 (Command
R7B: Cohere's block with sliding windows on 3 of every 4 layers and no RoPE on the global ones) against
transformers eager: tiny seeded random configs, every weight (the norms' too) moved off its init, saved with
save_pretrained and loaded through our public loader; maps and the last hidden state within 1e-5 in float32,
logits close, greedy tokens equal; the RoPE read from config.json in both forms (rope_parameters, and the
legacy rope_scaling + rope_theta); Part D: config.json as the hub checkpoints ship it, shrunk."""
from __future__ import annotations

import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub import test_parity_rotary_families as rotary  # noqa: E402
from tests.hub.test_parity_rotary_families import COMMON, N, TOL, VOCAB, max_differences  # noqa: E402
from tests.tiny_llama import train_tokenizer  # noqa: E402

COMMON4 = {**COMMON, "num_hidden_layers": 4}
_SLIDING, _FULL = "sliding_attention", "full_attention"

# name -> (transformers config class, model class, config overrides)
CASES = {
    # head_dim 16 (6 heads: 96 ≠ hidden_size 48), RoPE on half of it (transformers' default 0.5)
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(num_key_value_heads=2, head_dim=16, rope_theta=1000.0)),
    # three quarters of d_k = 8 rotated (3 interleaved pairs), no biases, tied
    "glm4-partial": ("Glm4Config", "Glm4ForCausalLM",
                     dict(num_key_value_heads=3, head_dim=8, partial_rotary_factor=0.75, attention_bias=False,
                          tie_word_embeddings=True)),
    # windows of 5 on layers 0-2, layer 3 global without RoPE (the default pattern of 4)
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(num_key_value_heads=2, sliding_window=5,
                                                             logit_scale=0.25, rope_theta=500.0)),
    # layer_types listed, biases on q, k, v and W_O, untied
    "cohere2-bias": ("Cohere2Config", "Cohere2ForCausalLM",
                     dict(num_key_value_heads=3, sliding_window=6, attention_bias=True, tie_word_embeddings=False,
                          logit_scale=0.7, layer_types=[_FULL, _SLIDING, _FULL, _SLIDING])),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(num_key_value_heads=3, logit_scale=0.5, rope_theta=800.0)),
    "cohere-bias": ("CohereConfig", "CohereForCausalLM",
                    dict(num_key_value_heads=2, attention_bias=True, tie_word_embeddings=False, head_dim=16)),
    # Command R+: a bias-free LayerNorm of each head's q and k before RoPE, with its own weight per head
    "cohere-qknorm": ("CohereConfig", "CohereForCausalLM", dict(num_key_value_heads=2, use_qk_norm=True,
                                                                 logit_scale=0.8)),
}
KINDS = {  # ModelInfo.layer_kinds (empty when every layer is plain global)
    "cohere2": ["local, window 5"] * 3 + ["global, no positions"],
    "cohere2-bias": ["global, no positions", "local, window 6"] * 2,
}
ROTATED = {"glm4": 8, "glm4-partial": 6}  # RoPE's share of d_k (Cohere: all of it)


def make_folder(folder, name: str):
    return rotary.make_folder(folder, name, CASES, COMMON4, seed=300)


built = rotary.built_fixture(make_folder)


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    family = json.loads((folder / "config.json").read_text())["model_type"]
    assert m.info.family == family and m.info.causal and m.info.can_generate
    assert list(m.info.layer_kinds) == KINDS.get(name, [])
    cfg = m.module.cfg
    assert cfg.rope_layout == "pairs" and cfg.rotary_dim == ROTATED.get(name, cfg.head_dim)
    block = m.module.blocks.layers[0]
    if family == "glm4":  # four norms: before and after each branch
        assert all(isinstance(getattr(block, n), torch.nn.Module) and hasattr(getattr(block, n), "weight")
                   for n in ("norm1", "post_attn_norm", "norm2", "post_mlp_norm"))
    else:  # one bias-free LayerNorm for both branches
        assert block.parallel and block.norm1.bias is None and isinstance(block.norm2, torch.nn.Identity)
    ids = torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(7))
    ours = rotary.check_parity(hf, m, name, ids)
    for layer, kind in enumerate(KINDS.get(name, [])):  # nothing outside each local layer's window
        if kind.startswith("local"):
            w = int(kind.split()[-1])
            i, j = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
            assert ours.attentions[:, layer][..., (i - j >= w) | (j > i)].abs().max() == 0


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_equals_transformers(built, name):
    """20 tokens through our KV cache (windows shorter than prompt + new tokens): transformers' tokens."""
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    lengths = []
    for prompt in PROMPTS:  # a random model may pick a special token (the end) early: then the next prompt
        _, steps = rotary.greedy_steps(hf, m, max_new_tokens=20, prompt=prompt)
        lengths.append(len(steps))
        if len(steps) == 20:
            break
    assert lengths[-1] == 20, lengths


PROMPTS = ("The capital of France is Paris. The capital of Italy", "Attention lets every token look at",
           "A small model with random weights still attends to something")


@pytest.mark.parametrize("change, far", [
    ("rope on the global layers", "cohere2"), ("no logit_scale", "cohere2"), ("half-split pairs", "glm4"),
    ("a norm of its own for the MLP", "cohere")])
def test_each_special_part_is_seen(built, change, far):
    """The parity above sees what is special: undo one part and the outputs leave transformers'."""
    hf, folder = built(far)
    m = ax.load_model(str(folder), device="cpu")
    cfg = m.module.cfg
    ids = torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(7))
    if change == "no logit_scale":
        cfg.logit_scale = 1.0
        with torch.no_grad(), torch.inference_mode():
            assert (m.module.logits(m.module(input_ids=ids).hidden) - hf(input_ids=ids).logits).abs().max() > 1e-2
        return
    if change == "rope on the global layers":
        cfg.nope_layers = None
    elif change == "half-split pairs":
        for block in m.module.blocks.layers:
            block.attn.rope_layout = "half"
    else:
        for block in m.module.blocks.layers:
            block.one_norm, block.norm2 = False, torch.nn.LayerNorm(48, bias=False)
    att, hidden, _ = max_differences(hf, m, ids)
    assert max(att, hidden) > 1e-3, (change, att, hidden)


DROPPED = {  # keys whose transformers default is what the case has: a config.json without them is the same model
    "glm4": ("hidden_act", "num_key_value_heads", "rms_norm_eps", "attention_bias", "tie_word_embeddings",
             "max_position_embeddings"),
    "cohere-bias": ("hidden_act", "layer_norm_eps", "logit_scale", "max_position_embeddings", "use_qk_norm"),
    "cohere2": ("hidden_act", "layer_types", "tie_word_embeddings", "attention_bias", "layer_norm_eps"),
}


@pytest.mark.parametrize("name", list(DROPPED))
def test_missing_keys_take_transformers_defaults(built, tmp_path, name):
    """GLM-4's default is 2 key/value heads (not one per head), every family's hidden_act silu."""
    hf, folder = built(name)
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in cfg.items() if k not in DROPPED[name]}))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    assert ref.config.num_key_value_heads == hf.config.num_key_value_heads  # the case was written with the default
    m = ax.load_model(str(tmp_path), device="cpu")
    ids = torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(4))
    att, hidden, _ = max_differences(ref, m, ids)
    assert att <= TOL and hidden <= TOL, (name, att, hidden)


def test_cohere2_ignores_a_head_dim_as_transformers_does(built, tmp_path):
    """Cohere2Config sets head_dim = hidden_size / heads whatever config.json says (Cohere reads it)."""
    hf, folder = built("cohere2")
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "head_dim": 16}))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.module.cfg.head_dim == 8
    att, hidden, _ = max_differences(hf, m, torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(4)))
    assert att <= TOL and hidden <= TOL


@pytest.mark.parametrize("name", ["glm4", "cohere2", "cohere", "cohere-qknorm"])
def test_bfloat16_equals_transformers_bfloat16(built, name):
    """In bfloat16 too: Cohere turns q and k in float32 (its cos and sin in bfloat16) and casts back, as
    transformers' Cohere does; GLM-4 turns them in the model's dtype."""
    _, folder = built(name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16,
                                                           attn_implementation="eager").eval()
    m = ax.load_model(str(folder), device="cpu", dtype="bfloat16")
    att, hidden, _ = max_differences(hf, m, torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(1)))
    print(f"{name} bfloat16: maps {att:.2e} hidden {hidden:.2e}")
    assert att == 0 and hidden == 0, (att, hidden)


# ---- RoPE in both forms of config.json -------------------------------------------------------------------------

ROPES = {  # name -> (case, rope_parameters besides rope_theta)
    "glm4-yarn": ("glm4", dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32,
                               partial_rotary_factor=0.5)),
    "cohere2-linear": ("cohere2", dict(rope_type="linear", factor=2.5)),
    "cohere-llama3": ("cohere", dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=8)),
}


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("name", list(ROPES))
def test_scaled_rope_in_both_config_forms(tmp_path, name, legacy):
    case, params = ROPES[name]
    cls, model_cls, overrides = CASES[case]
    theta = overrides.get("rope_theta", 10000.0)
    cases = {name: (cls, model_cls, {**overrides, "rope_parameters": {"rope_theta": theta, **params}})}
    hf = rotary.make_folder(tmp_path, name, cases, COMMON4, seed=7)
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    assert cfg["rope_parameters"]["rope_type"] == params["rope_type"]
    if legacy:  # as configs were written before transformers 5
        p = dict(cfg.pop("rope_parameters"))
        cfg["rope_theta"] = p.pop("rope_theta")
        if "partial_rotary_factor" in p:
            cfg["partial_rotary_factor"] = p.pop("partial_rotary_factor")
        cfg["rope_scaling"] = p
        path.write_text(json.dumps(cfg))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.module.cfg.rope_scaling.kind == params["rope_type"] and m.module.cfg.rope_theta == theta
    ids = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(5))  # past the original 32 / 8
    att, hidden, _ = max_differences(hf, m, ids)
    print(f"{name} ({'rope_scaling' if legacy else 'rope_parameters'}): maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL, (name, att, hidden)


# ---- bad fields: one line naming the family and the field ---------------------------------------------------------

@pytest.mark.parametrize("case, changes, words", [
    ("cohere", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("cohere2", {"logit_scale": None}, "logit_scale"),
    ("cohere2", {"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern"),
    ("cohere2", {"layer_types": ["sliding_attention"]}, "layer_types"),
    ("cohere2", {"sliding_window": -3}, "sliding_window"),
    ("cohere2", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1.0}}},
     "rope_parameters"),
    ("glm4", {"head_dim": None}, "head_dim"),
    ("glm4", {"partial_rotary_factor": 1.5, "rope_parameters": None}, "rotary"),
    ("glm4", {"hidden_act": "gelu"}, "hidden_act"),
])
def test_broken_fields_are_one_line(built, tmp_path, case, changes, words):
    _, folder = built(case)
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    message = str(e.value)
    assert "\n" not in message and words in message and case.rstrip("2") in message, message


def test_an_unknown_model_type_lists_the_new_families(built, tmp_path):
    _, folder = built("glm4")
    (tmp_path / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                      "model_type": "glm4_moe"}))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    words = set(re.findall(r"[\w-]+", str(e.value).replace("'glm4_moe'", "")))
    assert "'glm4_moe'" in str(e.value) and {"glm4", "cohere", "cohere2"} <= words


# ---- Part D: config.json as the hub checkpoints ship it, shrunk ------------------------------------------------

GLM4_0414 = dict(  # THUDM/GLM-4-9B-0414 (sizes shrunk: hidden 4096, 40 layers, 32 heads, 2 kv heads, vocab 151552)
    architectures=["Glm4ForCausalLM"], attention_bias=True, attention_dropout=0.0,
    eos_token_id=[2, 0, 1],  # real [151329, 151336, 151338]
    head_dim=16,  # real 128
    hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64,
    max_position_embeddings=32768, model_type="glm4", num_attention_heads=6, num_hidden_layers=3,
    num_key_value_heads=2, pad_token_id=0,  # real 151329
    partial_rotary_factor=0.5, rms_norm_eps=1e-05, rope_theta=10000.0, tie_word_embeddings=False,
    torch_dtype="bfloat16", transformers_version="4.51.3", use_cache=True, vocab_size=VOCAB)

COMMAND_R7B = dict(  # CohereLabs/c4ai-command-r7b-12-2024 (hidden 4096, 32 layers, 32 heads, 8 kv heads)
    architectures=["Cohere2ForCausalLM"], attention_bias=False, attention_dropout=0.0,
    bos_token_id=1,  # real 5
    cache_implementation="hybrid", eos_token_id=2,  # real 255001
    head_dim=8,  # real 128 (= hidden_size / heads, as here)
    hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64, layer_norm_eps=1e-05,
    layer_switch=4, logit_scale=0.25, max_position_embeddings=132096, model_type="cohere2",
    num_attention_heads=6, num_hidden_layers=4, num_key_value_heads=2,
    order_of_interleaved_layers="local_attn_first", pad_token_id=0, position_embedding_type="rope_gptj",
    rope_scaling=None, rope_theta=50000, rotary_pct=1.0,
    sliding_window=5,  # real 4096
    sliding_window_pattern=4, torch_dtype="bfloat16", transformers_version="4.48.0.dev0", use_cache=True,
    use_embedding_sharing=True, use_gated_activation=True, use_parallel_block=True, use_parallel_embedding=True,
    vocab_size=VOCAB)

COMMAND_R = dict(  # CohereForAI/c4ai-command-r-v01 (hidden 8192, 40 layers, 64 heads, vocab 256000)
    architectures=["CohereForCausalLM"], attention_bias=False, attention_dropout=0.0,
    bos_token_id=1, eos_token_id=2,  # real 5, 255001
    hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64, layer_norm_eps=1e-05,
    logit_scale=0.0625, max_position_embeddings=8192, model_max_length=131072, model_type="cohere",
    num_attention_heads=6, num_hidden_layers=3, num_key_value_heads=6, pad_token_id=0, rope_theta=8000000.0,
    torch_dtype="float16", transformers_version="4.38.2", use_cache=True, use_qk_norm=False, vocab_size=VOCAB)

COMMAND_R_PLUS = dict(  # CohereForAI/c4ai-command-r-plus (hidden 12288, 64 layers, 96 heads, 8 kv heads; values
    COMMAND_R, logit_scale=0.8333333333333334,  # as we know them from the hub file)
    num_key_value_heads=2, rope_theta=75000000.0, transformers_version="4.40.0.dev0", use_qk_norm=True)

HUB = {"glm4": (GLM4_0414, [], torch.bfloat16),
       "cohere-plus": (COMMAND_R_PLUS, [], torch.float16),
       "cohere2": (COMMAND_R7B, ["local, window 5"] * 3 + ["global, no positions"], torch.bfloat16),
       "cohere": (COMMAND_R, [], torch.float16)}


@pytest.mark.parametrize("family", list(HUB))
def test_a_hub_config_json_loads(tmp_path, family):
    """The real file's keys (architectures, torch_dtype, legacy rope_theta, Cohere's own unread keys), tiny
    sizes, a tiny random state dict under the real tensor names in the real dtype; no quantization_config."""
    config, kinds, dtype = HUB[family]
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf_cfg = transformers.AutoConfig.from_pretrained(str(tmp_path), attn_implementation="eager")
    torch.manual_seed(11)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
            p.copy_(p.to(dtype))  # what the stored checkpoint holds
    hf.to(dtype).save_pretrained(tmp_path, safe_serialization=True)
    (tmp_path / "config.json").write_text(json.dumps(config))  # the file exactly as the hub ships it
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    train_tokenizer().save(str(tmp_path / "tokenizer.json"))
    assert "quantization_config" not in json.loads((tmp_path / "config.json").read_text())
    m = ax.load_model(str(tmp_path), device="cpu", dtype="float32")
    assert m.info.family == family.removesuffix("-plus") and list(m.info.layer_kinds) == kinds
    ids = torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(2))
    att, hidden, _ = max_differences(hf, m, ids)
    print(f"{family} (hub config.json): maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL
    assert len(list(m.generate("The capital of France", max_new_tokens=5))) == 5
