"""Part D for the Mamba-2 hybrids: config.json as the real hub checkpoints ship it (ibm-granite/granite-4.0-h-tiny,
tiiuae/Falcon-H1-0.5B-Instruct: the same keys, architectures, torch_dtype, legacy rope_theta / rope_scaling,
layer_types' old names, Falcon-H1's head_dim apart from hidden_size / heads; no quantization_config), shrunk to
tiny sizes, bfloat16 weights under the checkpoints' names: it loads and matches transformers' own reading.
Also RoPE in both config forms, and broken fields refused in one line naming the family and the field."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_hub_configs import Row, reference  # noqa: E402
from tests.hub.test_parity_rotary_families import N, TOL, VOCAB, per_name  # noqa: E402
from tests.tiny_llama import train_tokenizer  # noqa: E402

GRANITE4_H_TINY = dict(  # its config.json's keys, sizes shrunk (real: 40 layers of 1536, 64 experts, 48 Mamba heads)
    architectures=["GraniteMoeHybridForCausalLM"], attention_bias=False, attention_dropout=0.0,
    attention_multiplier=0.0078125, bos_token_id=1, embedding_multiplier=12, eos_token_id=2, hidden_act="silu",
    hidden_size=32, init_method="mup", initializer_range=0.1, intermediate_size=16,
    layer_types=["mamba", "mamba", "attention", "mamba"], logits_scaling=6, mamba_chunk_size=8,
    mamba_conv_bias=True, mamba_d_conv=4, mamba_d_head=16, mamba_d_state=8, mamba_expand=2, mamba_n_groups=1,
    mamba_n_heads=4, mamba_proj_bias=False, max_position_embeddings=131072, model_type="granitemoehybrid",
    normalization_function="rmsnorm", num_attention_heads=4, num_experts_per_tok=2, num_hidden_layers=4,
    num_key_value_heads=2, num_local_experts=4, output_router_logits=False, pad_token_id=0,
    position_embedding_type="nope", residual_multiplier=0.22, rms_norm_eps=1e-05, rope_scaling=None,
    rope_theta=10000, router_aux_loss_coef=0.0, shared_intermediate_size=24, tie_word_embeddings=True,
    torch_dtype="bfloat16", transformers_version="4.56.0", use_cache=True, vocab_size=VOCAB)
FALCON_H1_05B = dict(  # real: 36 layers of 1024, 8 heads of 64 (not 1024 / 8), 24 Mamba heads of 64
    architectures=["FalconH1ForCausalLM"], attention_bias=False, attention_dropout=0.0, attention_in_multiplier=1.0,
    attention_out_multiplier=0.9375, attn_layer_indices=None, bos_token_id=1, embedding_multiplier=5.656854249492381,
    eos_token_id=11, head_dim=12, hidden_act="silu", hidden_size=32, initializer_range=0.02, intermediate_size=48,
    key_multiplier=0.390625, lm_head_multiplier=0.0390625, mamba_chunk_size=8, mamba_conv_bias=True,
    mamba_d_conv=4, mamba_d_head=12, mamba_d_ssm=48, mamba_d_state=8, mamba_expand=2, mamba_n_groups=1,
    mamba_n_heads=4, mamba_norm_before_gate=False, mamba_proj_bias=False, mamba_rms_norm=False,
    mamba_use_mlp=True, max_position_embeddings=16384, mlp_bias=False, mlp_expansion_factor=8,
    mlp_multipliers=[0.8838834764831844, 0.5859375], model_type="falcon_h1", num_attention_heads=4,
    num_hidden_layers=3, num_key_value_heads=2, num_logits_to_keep=1, pad_token_id=0, projectors_bias=False,
    rms_norm_eps=1e-05, rope_scaling=None, rope_theta=100000000000.0, ssm_in_multiplier=1.25,
    ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    ssm_out_multiplier=0.23570226039551587, tie_word_embeddings=False, torch_dtype="bfloat16",
    transformers_version="4.53.0.dev0", use_cache=True, vocab_size=VOCAB)
ROWS = {
    "granite-4.0-h-tiny": Row("ibm-granite/granite-4.0-h-tiny", GRANITE4_H_TINY,
                              ["Mamba-2 (implicit)"] * 2 + ["softmax, global, no positions", "Mamba-2 (implicit)"]),
    "falcon-h1-0.5b": Row("tiiuae/Falcon-H1-0.5B-Instruct", FALCON_H1_05B,
                          ["softmax, global + Mamba-2 (not drawn)"] * 3),
}
MINE = list(ROWS)


def make_hub_folder(folder, name: str):
    """transformers' model from the row's config.json, every weight moved off its init (A_log, D, dt_bias, norms
    too), saved in bfloat16 under the checkpoint's names; then config.json is the row's own. Returns the folder."""
    cfg = ROWS[name].config
    torch.manual_seed(MINE.index(name))
    hf = getattr(transformers, cfg["architectures"][0])(transformers.CONFIG_MAPPING[cfg["model_type"]].from_dict(
        dict(cfg))).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            p.copy_(torch.randn_like(p) * 0.15 + (1.0 if "norm" in pname else 0.0))
    hf.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    train_tokenizer().save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    return per_name(tmp_path_factory, make_hub_folder)


def _softmax_layers(m):
    return [i for i, k in enumerate(m.module.cfg.mixers()) if k == "softmax"]


def _compare(hf, m, ids):
    with torch.no_grad():
        ref = hf.model(input_ids=ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
    layers = _softmax_layers(m)
    maps = max((ours.attentions[:, i, :a.shape[1]] - a).abs().max().item() for i, a in zip(layers, ref.attentions))
    return maps, (ours.hidden - ref.last_hidden_state).abs().max().item(), ours


@pytest.mark.parametrize("name", MINE)
def test_a_real_config_json_loads_and_matches_transformers(hub, name):
    row = ROWS[name]
    folder = hub(name)
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.family == row.config["model_type"] and list(m.info.layer_kinds) == row.kinds
    assert {p.dtype for p in m.module.parameters()} == {torch.float32}
    hf = reference(folder, row.config)
    ids = torch.randint(5, VOCAB, (2, N), generator=torch.Generator().manual_seed(7))
    maps, hidden, ours = _compare(hf, m, ids)
    scale = max(1.0, ours.hidden.abs().max().item())
    print(f"{name} ({row.real}): maps {maps:.2g} hidden {hidden:.2g} (largest entry {scale:.2g})")
    assert maps <= TOL and hidden <= TOL * scale


@pytest.mark.parametrize("form", ["legacy", "rope_parameters"])
def test_rope_in_both_config_forms(hub, tmp_path, form):
    """Falcon-H1's RoPE (theta 1e11, linear scaling 2 here) and Granite 4 with position_embedding_type 'rope',
    written as rope_theta + rope_scaling (legacy) or transformers 5's rope_parameters: the same model."""
    for name, extra in (("falcon-h1-0.5b", {}), ("granite-4.0-h-tiny", {"position_embedding_type": "rope"})):
        folder = tmp_path / name
        folder.mkdir()
        make_hub_folder(folder, name)
        cfg = {**ROWS[name].config, **extra}
        theta = cfg.pop("rope_theta")
        cfg.pop("rope_scaling")
        if form == "legacy":
            cfg.update(rope_theta=theta, rope_scaling={"type": "linear", "factor": 2.0})
        else:
            cfg["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": theta}
        (folder / "config.json").write_text(json.dumps(cfg))
        m = ax.load_model(str(folder), device="cpu")
        assert m.module.cfg.rope_scaling.kind == "linear" and m.module.cfg.rope_theta == theta
        assert m.module.cfg.nope_layers is None
        ids = torch.randint(5, VOCAB, (1, N), generator=torch.Generator().manual_seed(2))
        maps, hidden, ours = _compare(reference(folder, cfg), m, ids)
        assert maps <= TOL and hidden <= TOL * max(1.0, ours.hidden.abs().max().item()), (name, form, maps, hidden)


@pytest.mark.parametrize("name,changes,field", [
    ("granite-4.0-h-tiny", {"layer_types": ["mamba", "conv", "attention", "mamba"]}, "layer_types"),
    ("granite-4.0-h-tiny", {"position_embedding_type": "alibi"}, "position_embedding_type"),
    ("granite-4.0-h-tiny", {"mamba_n_heads": 3}, "mamba_n_heads"),
    ("granite-4.0-h-tiny", {"mamba_n_groups": 3}, "mamba_n_groups"),
    ("granite-4.0-h-tiny", {"time_step_limit": [0.5, 0.1]}, "time_step_limit"),
    ("granite-4.0-h-tiny", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("falcon-h1-0.5b", {"ssm_multipliers": [1.0, 1.0]}, "ssm_multipliers"),
    ("falcon-h1-0.5b", {"key_multiplier": "big"}, "key_multiplier"),
    ("falcon-h1-0.5b", {"mamba_d_ssm": 50}, "mamba_d_head"),
])
def test_broken_fields_are_one_line(hub, tmp_path, name, changes, field):
    make_hub_folder(tmp_path, name)
    (tmp_path / "config.json").write_text(json.dumps({**ROWS[name].config, **changes}))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    message = str(e.value)
    assert "\n" not in message and field in message and ROWS[name].config["model_type"] in message, message
