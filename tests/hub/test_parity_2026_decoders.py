"""SmolLM3 (NoPE layers), Granite (multipliers) and OLMo 2 / 3 (norms after each branch, QK-norm over
every head's width, OLMo 3's sliding windows) against transformers eager: tiny seeded random configs,
every weight (the norms' too) moved off its init, saved with save_pretrained and loaded through our
public loader; attention maps and the last hidden state within 1e-5 in float32, logits and greedy
tokens as transformers'."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub import test_parity_rotary_families as rotary  # noqa: E402
from tests.hub.test_parity_rotary_families import COMMON, N, VOCAB, max_differences  # noqa: E402

COMMON4 = {**COMMON, "num_hidden_layers": 4}

# name -> (transformers config class, model class, config overrides)
CASES = {
    # every 4th layer without RoPE (transformers' default interval)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(num_key_value_heads=2, rope_theta=1000.0)),
    # NoPE layers listed; a window of 5 on them (use_sliding_window), untied head
    "smollm3-window": ("SmolLM3Config", "SmolLM3ForCausalLM",
                       dict(num_key_value_heads=3, no_rope_layers=[1, 0, 1, 0], use_sliding_window=True,
                            sliding_window=5, tie_word_embeddings=False)),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(num_key_value_heads=2, embedding_multiplier=12.0, attention_multiplier=0.0078125 * 3,
                     residual_multiplier=0.22, logits_scaling=8.0)),
    "granite-bias": ("GraniteConfig", "GraniteForCausalLM",
                     dict(num_key_value_heads=3, attention_bias=True, mlp_bias=True, embedding_multiplier=6.5,
                          attention_multiplier=0.3, residual_multiplier=0.7, logits_scaling=3.3,
                          tie_word_embeddings=True)),
    # norms only after each branch, q/k norms over all heads' width (grouped: k's is H_kv·d_k wide)
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(num_key_value_heads=2, rope_theta=1000.0)),
    "olmo2-bias": ("Olmo2Config", "Olmo2ForCausalLM", dict(num_key_value_heads=6, attention_bias=True,
                                                            tie_word_embeddings=True)),
    # 3 sliding layers (window 5) to 1 full, transformers' default pattern
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(num_key_value_heads=2, sliding_window=5)),
    # the sliding layers' own RoPE base, from a per-layer-type rope_parameters
    "olmo3-local-rope": ("Olmo3Config", "Olmo3ForCausalLM",
                         dict(num_key_value_heads=3, sliding_window=6,
                              layer_types=["full_attention", "sliding_attention", "sliding_attention",
                                           "full_attention"],
                              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50000.0},
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
}
# ModelInfo.layer_kinds: per layer, as the grid's header shows it (empty when every layer is plain global)
KINDS = {
    "smollm3": ["global", "global", "global", "global, no positions"],
    "smollm3-window": ["global", "local, window 5, no positions", "global", "local, window 5, no positions"],
    "olmo3": ["local, window 5"] * 3 + ["global"],
    "olmo3-local-rope": ["global", "local, window 6", "local, window 6", "global"],
}


def make_folder(folder, name: str):
    return rotary.make_folder(folder, name, CASES, COMMON4, seed=100)


built = rotary.built_fixture(make_folder)


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    family = json.loads((folder / "config.json").read_text())["model_type"]
    assert m.info.family == family and m.info.causal and m.info.can_generate
    assert list(m.info.layer_kinds) == KINDS.get(name, [])
    cfg = m.module.cfg
    if family.startswith("olmo"):  # q's norm is H·d_k wide, k's H_kv·d_k; no norm before either branch
        attn = m.module.blocks.layers[0].attn
        assert attn.q_norm.weight.shape[0] == 48 and attn.k_norm.weight.shape[0] == 8 * cfg.num_kv_heads
        assert not cfg.pre_norms
    assert cfg.rope_local_theta == (100.0 if name == "olmo3-local-rope" else None)
    rotary.check_parity(hf, m, name, torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(7)))


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_equals_transformers(built, name):
    """Through our KV cache (NoPE layers, windows shorter than prompt + new tokens): transformers' tokens."""
    hf, folder = built(name)
    rotary.greedy_steps(hf, ax.load_model(str(folder), device="cpu"), max_new_tokens=6)


def test_rope_on_the_nope_layers_would_differ(built):
    """The parity above sees the NoPE layers: with RoPE on every layer the maps leave transformers'."""
    hf, folder = built("smollm3-window")
    m = ax.load_model(str(folder), device="cpu")
    assert m.module.cfg.nope_layers == [False, True, False, True]
    m.module.cfg.nope_layers = None
    ids = torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(7))
    att, hidden, _ = max_differences(hf, m, ids)
    assert att > 1e-3 and hidden > 1e-3


def test_broken_fields_are_one_line(tmp_path):
    make_folder(tmp_path, "smollm3")
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    for changes in ({"no_rope_layers": [1, 0]}, {"no_rope_layers": None, "no_rope_layer_interval": 0}):
        path.write_text(json.dumps({**cfg, **changes}))
        with pytest.raises(UserError) as e:
            ax.load_model(str(tmp_path), device="cpu")
        assert "\n" not in str(e.value) and "smollm3" in str(e.value)
    path.write_text(json.dumps({**cfg, "model_type": "granite", "logits_scaling": 0}))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(e.value) and "logits_scaling" in str(e.value)


def test_an_unknown_model_type_lists_the_new_families(tmp_path):
    make_folder(tmp_path, "olmo2")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "olmoe"}))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    message = str(e.value)
    assert "\n" not in message and "'olmoe'" in message
    assert all(f in message for f in ("smollm3", "granite", "olmo2", "olmo3"))
