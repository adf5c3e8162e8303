"""Gemma 4's text model (core/gemma4.py) against transformers' Gemma4ForCausalLM in eager mode: tiny seeded
random configs, every weight moved off its init (the norms' and the layer scalars too), windows shorter than
the input, local layers with their own d_k and RoPE base, global ones with a wider d_k and proportional RoPE;
attention_k_eq_v on and off, KV sharing, double-wide MLPs, per-layer inputs and MoE. Maps and the last hidden
state within 1e-5 in float32, logits close, greedy tokens equal; folders shaped like google/gemma-4-31B-it's and
-E2B-it's (part D). Part C (hooks, lazy, interventions, analyses) is in tests/hub/test_gemma4_tools.py."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.gemma4")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from attn_explorer.core import linear  # noqa: E402
from tests.hub.test_parity import linear_path  # noqa: E402,F401
from tests.hub.test_parity_rotary_families import (N, TOL, VOCAB, built_fixture, check_parity,  # noqa: E402
                                                   greedy_steps, max_differences)
from tests.tiny_llama import train_tokenizer  # noqa: E402

WINDOW = 5  # < N: the local layers' rows are cut
TYPES6 = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
          "full_attention"]
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 5000.0}}
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_attention_heads=4, head_dim=8,
              global_head_dim=16, sliding_window=WINDOW, max_position_embeddings=128, attn_implementation="eager",
              bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2, vocab_size_per_layer_input=VOCAB)
CASES = {
    # k = v on the global layers (1 key/value head there, 2 on the local ones), the last 2 layers read layer 3's
    # and layer 2's keys and values with MLPs twice as wide, per-layer inputs, a final soft-cap, tied head
    "k_eq_v-shared-ple": dict(num_hidden_layers=6, layer_types=TYPES6, num_key_value_heads=2,
                              num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2,
                              use_double_wide_mlp=True, hidden_size_per_layer_input=4, final_logit_softcapping=3.0,
                              rope_parameters=ROPE),
    # separate values, no sharing, no per-layer inputs, transformers' default layer pattern and RoPE
    # (proportional 0.25 at 1e6 on the global layers, 1e4 on the local ones), untied head with biases
    "dense": dict(num_hidden_layers=7, num_key_value_heads=2, num_global_key_value_heads=1, attention_k_eq_v=False,
                  hidden_size_per_layer_input=0, tie_word_embeddings=False, attention_bias=True),
    # k = v with the local layers' key/value heads on the global ones too; per-layer inputs without sharing
    "k_eq_v-ple": dict(num_hidden_layers=4, num_key_value_heads=1, attention_k_eq_v=True,
                       hidden_size_per_layer_input=6, final_logit_softcapping=5.0,
                       layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                       rope_parameters=ROPE),
    # 26B-A4B's kind: every layer routes each token to 2 of 4 experts beside its dense MLP (enable_moe_block)
    "moe": dict(num_hidden_layers=4, num_key_value_heads=2, num_global_key_value_heads=1, attention_k_eq_v=True,
                hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=4, top_k_experts=2,
                moe_intermediate_size=12, final_logit_softcapping=30.0, rope_parameters=ROPE,
                layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]),
}
# The oneDNN fast path (prepacked products, core.linear) rounds its sums in another order than F.linear: through
# these odd widths (37, 6) and the per-layer inputs the last hidden state drifts up to 1.5e-5 from transformers'
# on it, while F.linear gives 0 / 0. Both are tested; the fast path within FAST_TOL.
FAST_TOL = 5e-5
KINDS = {
    "k_eq_v-shared-ple": ["local, window 5", "local, window 5", "global", "local, window 5",
                          "local, window 5, keys and values of layer 3", "global, keys and values of layer 2"],
    "dense": ["local, window 5"] * 5 + ["global", "global"],  # the last layer is always global
    "k_eq_v-ple": ["local, window 5", "global"] * 2,
    "moe": ["local, window 5"] * 3 + ["global"],
}


def make_folder(folder, name: str):
    torch.manual_seed(400 + sorted(CASES).index(name))
    hf = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**{**COMMON, **CASES[name]})).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.dim() < 3 else 0.3))  # the experts start at 0.02
        for n, b in hf.named_buffers():
            if n.endswith("layer_scalar"):
                b.mul_(0.5 + torch.rand(1))
    hf.save_pretrained(folder, safe_serialization=True)
    train_tokenizer().save(str(folder / "tokenizer.json"))
    return hf


built = built_fixture(make_folder)


def _ids():
    return torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(built, name, linear_path):
    hf, folder = built(name)
    tol = TOL if linear_path == "flinear" else FAST_TOL
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.family == "gemma4_text" and m.info.causal and m.info.can_generate
    assert list(m.info.layer_kinds) == KINDS[name]
    cfg = m.module.cfg
    own = "rope_parameters" in CASES[name]  # else transformers' default: 1e6 global, 1e4 local
    assert cfg.rope_scaling.kind == "proportional" and cfg.rope_scaling.proportion == (0.5 if own else 0.25)
    assert (cfg.rope_theta, cfg.rope_local_theta) == ((5000.0, 100.0) if own else (1e6, 1e4))
    ours = check_parity(hf, m, name, _ids(), tol=tol, label=f"gemma4 {name} ({linear_path})")
    for layer, w in enumerate(cfg.sliding_windows):  # exactly zero outside each local query's window
        if w:
            i, j = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
            assert ours.attentions[:, layer][..., (i - j >= w) | (j > i)].abs().max() == 0


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_equals_transformers(built, name):
    """20 tokens through our KV cache (shared slots on the KV-sharing layers; windows shorter than the text)."""
    hf, folder = built(name)
    _, steps = greedy_steps(hf, ax.load_model(str(folder), device="cpu"), max_new_tokens=20)
    assert len(steps) == 20


@pytest.mark.parametrize("what", ["local rope", "shared kv", "layer scalar"])
def test_each_difference_from_gemma3_is_seen(built, what):
    """The parity above sees the split RoPE, the KV sharing and the layer scalars: without each, it fails."""
    hf, folder = built("k_eq_v-shared-ple")
    m = ax.load_model(str(folder), device="cpu")
    if what == "local rope":
        m.module.cfg.rope_local_theta = m.module.cfg.rope_theta
        m.module._rope_cache.clear()
    elif what == "shared kv":  # layer 4 reads layer 1's keys and values instead of layer 3's
        m.module.cfg.kv_source = [None, None, None, None, 1, 2]
    else:
        for block in m.module.blocks.layers:
            block.layer_scalar.fill_(1.0)
    att, hidden, _ = max_differences(hf, m, _ids())
    assert max(att, hidden) > 1e-3, what


def test_the_multimodal_config_loads_its_language_model(tmp_path, built, monkeypatch):
    """model_type gemma4 (Gemma4ForConditionalGeneration's folder): text_config, the language model's weights
    under model.language_model., the vision tower's tensors left out."""
    from safetensors.torch import load_file, save_file

    monkeypatch.setattr(linear, "fast_path_enabled", False)
    hf, folder = built("k_eq_v-ple")
    text = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
        "vision_config": {"model_type": "gemma4_vision"}, "audio_config": None, "tie_word_embeddings": True,
        "image_token_id": 258880, "dtype": "float32"}))
    sd = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
          for k, v in load_file(str(folder / "model.safetensors")).items()}
    sd["model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight"] = torch.zeros(3, 3)
    sd["model.embed_vision.embedding_projection.weight"] = torch.zeros(3, 3)
    save_file(sd, str(tmp_path / "model.safetensors"))
    train_tokenizer().save(str(tmp_path / "tokenizer.json"))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.info.family == "gemma4_text"
    assert "not loaded" in m.info.note and "vision" in m.info.note  # the user is told what is missing
    att, hidden, _ = max_differences(hf, m, _ids())
    assert att <= TOL and hidden <= TOL


def _real_31b_shape(**changes) -> dict:
    """google/gemma-4-31B-it's config.json (its keys, dtype, architectures; no quantization_config), shrunk."""
    types = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    text = {
        "attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": True, "bos_token_id": 2,
        "dtype": "bfloat16", "enable_moe_block": False, "eos_token_id": 1, "expert_intermediate_size": None,
        "final_logit_softcapping": 30.0, "global_head_dim": 16, "head_dim": 8,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 32, "hidden_size_per_layer_input": 0,
        "initializer_range": 0.02, "intermediate_size": 48, "layer_types": types, "max_position_embeddings": 262144,
        "model_type": "gemma4_text", "moe_intermediate_size": None, "num_attention_heads": 4, "num_experts": None,
        "num_global_key_value_heads": 1, "num_hidden_layers": 12, "num_key_value_heads": 2,
        "num_kv_shared_layers": 0, "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                               "rope_type": "proportional"},
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "sliding_window": 1024, "tie_word_embeddings": True, "top_k_experts": None,
        "use_bidirectional_attention": "vision", "use_cache": True, "use_double_wide_mlp": False,
        "vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB}
    text.update(changes)
    # the placeholder ids shrunk into the tiny vocabulary too (258880, 258881, 258884 in the real one)
    return {"architectures": ["Gemma4ForConditionalGeneration"], "audio_config": None, "audio_token_id": 6,
            "boa_token_id": 256000, "boi_token_id": 255999, "dtype": "bfloat16", "eoa_token_id": 258883,
            "eoa_token_index": 258883, "eoi_token_id": 258882, "eos_token_id": [1, 106], "image_token_id": 5,
            "initializer_range": 0.02, "model_type": "gemma4", "text_config": text, "tie_word_embeddings": True,
            "transformers_version": "5.7.0", "video_token_id": 7,
            "vision_config": {"model_type": "gemma4_vision", "hidden_size": 1152, "num_hidden_layers": 27},
            "vision_soft_tokens_per_image": 280}


def test_a_hub_shaped_config_loads_with_a_tiny_state_dict(tmp_path, monkeypatch):
    """Part D: the 31B's config.json (global_head_dim / num_global_key_value_heads, no per_layer_config),
    its tensor names, bfloat16 weights; loads, and matches transformers built from the same folder."""
    monkeypatch.setattr(linear, "fast_path_enabled", False)
    cfg = _real_31b_shape()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(3)
    fp32 = {**cfg, "dtype": "float32", "text_config": {**cfg["text_config"], "dtype": "float32"}}  # fp32 RoPE tables
    hf = transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config(**{
        k: v for k, v in fp32.items() if k not in ("architectures", "vision_config", "transformers_version")},
        attn_implementation="eager")).eval()
    sd = {k: (v + torch.randn_like(v) * 0.1).to(torch.bfloat16) for k, v in hf.state_dict().items()
          if k != "lm_head.weight"}
    from safetensors.torch import save_file
    save_file(sd, str(tmp_path / "model.safetensors"))
    train_tokenizer().save(str(tmp_path / "tokenizer.json"))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.info.family == "gemma4_text" and m.info.num_layers == 12
    assert m.info.layer_kinds[:6] == ("local, window 1024",) * 5 + ("global",)
    blocks = m.module.blocks.layers
    assert blocks[5].attn.head_dim == 16 and blocks[5].attn.num_kv_heads == 1 and not hasattr(blocks[5].attn, "value")
    assert blocks[0].attn.head_dim == 8 and blocks[0].attn.num_kv_heads == 2
    hf.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    hf.tie_weights()
    hf.float()
    ids = _ids()
    ids[0, 3], ids[0, 5], ids[1, 8] = 5, 6, 7  # the image, audio and video placeholders: padding, no image here
    with torch.no_grad():
        ref = hf.model(input_ids=ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
    assert (ours.hidden - ref.last_hidden_state).abs().max() <= TOL
    m.module.cfg.placeholder_ids = None  # the placeholders embedded as themselves: not transformers' model
    with torch.inference_mode():
        assert (m.module(input_ids=ids).hidden - ref.last_hidden_state).abs().max() > 1e-3


@pytest.mark.parametrize("changes, field", [
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": None}, "top_k_experts"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ({"rope_theta": 10000.0}, "rope_theta"),  # the legacy form: transformers' Gemma 4 does not read it
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}}, "rope_parameters"),  # flat: not per type
    ({"rope_parameters": {**ROPE, "full_attention": {"rope_type": "yarn", "factor": 2.0}}}, "yarn"),
    ({"num_kv_shared_layers": 12}, "num_kv_shared_layers"),
    ({"sliding_window": None}, "sliding_window"),
])
def test_unsupported_fields_are_refused_in_one_line(tmp_path, changes, field):
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps(_real_31b_shape(**changes)))
    save_file({"model.language_model.norm.weight": torch.ones(32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(e.value) and "gemma4" in str(e.value) and field in str(e.value), str(e.value)


def test_kv_sharing_layers_own_k_v_tensors_in_the_checkpoint_are_left_unread(tmp_path, built, monkeypatch):
    """google/gemma-4-E2B's checkpoint still holds k_proj / v_proj / k_norm of its KV-sharing layers, which
    transformers never builds nor reads: they load here too, unread (they were refused as having no place)."""
    from safetensors.torch import load_file, save_file

    monkeypatch.setattr(linear, "fast_path_enabled", False)
    hf, folder = built("k_eq_v-shared-ple")
    sd = load_file(str(folder / "model.safetensors"))
    for i, width in ((4, 16), (5, 16)):
        sd[f"model.layers.{i}.self_attn.k_proj.weight"] = torch.ones(width, 32)
        sd[f"model.layers.{i}.self_attn.v_proj.weight"] = torch.ones(width, 32)
        sd[f"model.layers.{i}.self_attn.k_norm.weight"] = torch.ones(8)
    save_file(sd, str(tmp_path / "model.safetensors"))
    for f in ("config.json", "tokenizer.json"):
        (tmp_path / f).write_text((folder / f).read_text())
    m = ax.load_model(str(tmp_path), device="cpu")
    att, hidden, _ = max_differences(hf, m, _ids())
    assert att <= TOL and hidden <= TOL
    sd["model.layers.2.self_attn.v_proj.weight"] = torch.ones(16, 32)  # a k = v layer has none: still refused
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError):
        ax.load_model(str(tmp_path), device="cpu")


def _real_e2b_shape() -> dict:
    """google/gemma-4-E2B-it's config.json (per-layer inputs, the last layers sharing keys and values, double-wide
    MLPs there, 4 local : 1 global, an audio tower), shrunk: 10 layers, the last 4 sharing."""
    types = (["sliding_attention"] * 4 + ["full_attention"]) * 2
    text = {
        "attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": False, "bos_token_id": 2,
        "dtype": "bfloat16", "enable_moe_block": False, "eos_token_id": 1, "final_logit_softcapping": 30.0,
        "global_head_dim": 16, "head_dim": 8, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 32,
        "hidden_size_per_layer_input": 4, "initializer_range": 0.02, "intermediate_size": 24, "layer_types": types,
        "max_position_embeddings": 131072, "model_type": "gemma4_text", "num_attention_heads": 4,
        "num_global_key_value_heads": None, "num_hidden_layers": 10, "num_key_value_heads": 1,
        "num_kv_shared_layers": 4, "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                               "rope_type": "proportional"},
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "sliding_window": 512, "tie_word_embeddings": True, "use_bidirectional_attention": None, "use_cache": True,
        "use_double_wide_mlp": True, "vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB}
    return {"architectures": ["Gemma4ForConditionalGeneration"], "audio_token_id": 258881, "boa_token_id": 256000,
            "boi_token_id": 255999, "dtype": "bfloat16", "eoa_token_id": 258883, "eoi_token_id": 258882,
            "eos_token_id": [1, 106], "image_token_id": 258880, "initializer_range": 0.02, "model_type": "gemma4",
            "text_config": text, "tie_word_embeddings": True, "transformers_version": "5.5.0.dev0",
            "video_token_id": 258884, "vision_soft_tokens_per_image": 280,
            "audio_config": {"model_type": "gemma4_audio", "hidden_size": 1024, "num_hidden_layers": 12},
            "vision_config": {"model_type": "gemma4_vision", "hidden_size": 768, "num_hidden_layers": 16}}


def test_an_e2b_shaped_folder_loads_with_its_stored_unread_tensors(tmp_path, monkeypatch):
    """Part D: E2B's config.json, bfloat16 weights under its names, the towers' tensors and the KV-sharing
    layers' own (unread) k/v tensors as its checkpoint holds them; matches transformers on the same weights."""
    from safetensors.torch import save_file

    monkeypatch.setattr(linear, "fast_path_enabled", False)
    cfg = _real_e2b_shape()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    text = {**cfg["text_config"], "dtype": "float32"}
    torch.manual_seed(5)
    hf = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**text, attn_implementation="eager")).eval()
    sd = {"model.language_model." + k[len("model."):]: (v + torch.randn_like(v) * 0.1).to(torch.bfloat16)
          for k, v in hf.state_dict().items() if k.startswith("model.")}
    for i in range(6, 10):  # the sharing layers' own projections, stored but never read
        width = 16 if i == 9 else 8
        sd[f"model.language_model.layers.{i}.self_attn.k_proj.weight"] = torch.ones(width, 32, dtype=torch.bfloat16)
        sd[f"model.language_model.layers.{i}.self_attn.v_proj.weight"] = torch.ones(width, 32, dtype=torch.bfloat16)
    sd["model.audio_tower.layers.0.feed_forward1.ffw_layer_1.linear.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    sd["model.embed_audio.embedding_projection.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    sd["model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    save_file(sd, str(tmp_path / "model.safetensors"))
    train_tokenizer().save(str(tmp_path / "tokenizer.json"))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.info.family == "gemma4_text" and m.info.num_layers == 10
    assert m.info.layer_kinds[6] == "local, window 512, keys and values of layer 5"
    assert m.info.layer_kinds[9] == "global, keys and values of layer 4"
    assert m.module.blocks.layers[7].mlp.down.weight.shape == (32, 48)  # double-wide where it shares
    own = hf.state_dict()  # transformers reads the same weights (not the unread ones, which it has no place for)
    renamed = {"model." + k[len("model.language_model."):]: v.float() for k, v in sd.items()
               if k.startswith("model.language_model.")}
    hf.load_state_dict({k: v for k, v in renamed.items() if k in own}, strict=False)
    att, hidden, _ = max_differences(hf, m, _ids())
    assert att <= TOL and hidden <= TOL, (att, hidden)
