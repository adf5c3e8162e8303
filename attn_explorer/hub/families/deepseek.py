"""DeepSeek-V3 (and the checkpoints that share its model_type: Moonlight, Kimi K2): the Llama-style decoder
with multi-head latent attention on every layer (core.mla) and, from first_k_dense_replace on, a
mixture-of-experts MLP (core.moe's DeepSeek router: sigmoid scores, e_score_correction_bias for choosing,
group-limited top-k, routed_scaling_factor, shared experts). The multi-token-prediction layers a
checkpoint may carry past num_hidden_layers (num_nextn_predict_layers) are left out, as transformers does."""
from __future__ import annotations

import re
from dataclasses import replace

from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.mla import MLAConfig, yarn_mscale
from attn_explorer.core.moe import MoEConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, B as _B, Architecture, act, norm_eps, rope,
                                               rope_entry, rope_kind, rope_positions)

FAMILY = "deepseek_v3"


def _size(cfg: dict, key: str, default, optional: bool = False):
    """A size field (transformers' DeepseekV3Config default where config.json has none): a whole number >= 1,
    or null where optional (q_lora_rank)."""
    v = cfg.get(key, default)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise UserError(f"{FAMILY}: {key} must be a whole number >= 1{' or null' if optional else ''}, got {v!r}")
    return v


def _softmax_scale(cfg: dict, qk_head_dim: int) -> float:
    """transformers' softmax scale: d_qk^-1/2, times mscale(factor, mscale_all_dim)² where the RoPE entry has a
    scaling type other than default and a mscale_all_dim (DeepSeek-V3's YaRN: 40x, mscale_all_dim 1)."""
    scale = qk_head_dim ** -0.5
    p, _ = rope_entry(cfg, FAMILY)
    m = p.get("mscale_all_dim")
    if rope_kind(p) != "default" and m:
        factor = p.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not isinstance(m, (int, float)):
            raise UserError(f"{FAMILY}: rope factor and mscale_all_dim must be numbers, got {factor!r}, {m!r}")
        scale *= yarn_mscale(factor, m) ** 2
    return scale


def _moe(cfg: dict) -> tuple[MoEConfig | None, list | None]:
    """The MoE layers' router and experts, and which layers they are (first_k_dense_replace on); (None,
    None) where every layer is dense."""
    n = cfg["num_hidden_layers"]
    first = cfg.get("first_k_dense_replace", 3)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise UserError(f"{FAMILY}: first_k_dense_replace must be a whole number >= 0, got {first!r}")
    if first >= n:
        return None, None
    for key, want in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("moe_layer_freq", 1)):
        if cfg.get(key, want) != want:  # the original code's options that transformers' DeepSeek-V3 does not have
            raise UserError(f"{FAMILY}: {key} {cfg[key]!r} is not supported (only {want!r}, as transformers runs it)")
    experts = _size(cfg, "n_routed_experts", 256)
    width = _size(cfg, "moe_intermediate_size", 2048)
    shared = cfg.get("n_shared_experts", 1) or 0
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise UserError(f"{FAMILY}: n_shared_experts must be a whole number >= 0, got {shared!r}")
    factor = cfg.get("routed_scaling_factor", 2.5)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise UserError(f"{FAMILY}: routed_scaling_factor must be a number, got {factor!r}")
    try:
        moe = MoEConfig(num_experts=experts, top_k=_size(cfg, "num_experts_per_tok", 8), hidden=width,
                        scoring="sigmoid", norm_topk=bool(cfg.get("norm_topk_prob", True)), choice_bias=True,
                        n_group=_size(cfg, "n_group", 8), topk_group=_size(cfg, "topk_group", 4),
                        scaling=float(factor), shared_hidden=width * shared, router_fp32=True)
    except ValueError as e:
        raise UserError(f"{FAMILY}: {e}") from None
    return moe, [i >= first for i in range(n)]


def _deepseek_config(cfg: dict) -> LlamaConfig:
    heads = cfg["num_attention_heads"]
    if cfg.get("num_key_value_heads") not in (None, heads):
        raise UserError(f"{FAMILY}: num_key_value_heads must equal num_attention_heads ({heads}): latent attention "
                        f"rebuilds every head's keys, got {cfg['num_key_value_heads']!r}")
    if act(cfg, "hidden_act") != "silu":
        raise UserError(f"{FAMILY} with hidden_act {cfg.get('hidden_act')!r} is not supported (only silu)")
    bias = cfg.get("attention_bias", False)
    if not isinstance(bias, bool):
        raise UserError(f"{FAMILY}: attention_bias must be true or false, got {bias!r}")
    interleave = cfg.get("rope_interleave", True)
    interleave = False if interleave is None else interleave  # transformers: null is false (rotate_half)
    if not isinstance(interleave, bool):
        raise UserError(f"{FAMILY}: rope_interleave must be true or false, got {interleave!r}")
    rope_dim = _size(cfg, "qk_rope_head_dim", 64)
    if rope_dim % 2:
        raise UserError(f"{FAMILY}: RoPE needs an even qk_rope_head_dim, got {rope_dim}")
    theta, fraction, scaling = rope(cfg, FAMILY, rope_dim)
    if fraction != 1.0:
        raise UserError(f"{FAMILY}: partial_rotary_factor is not supported (qk_rope_head_dim says what turns)")
    mla = MLAConfig(kv_lora_rank=_size(cfg, "kv_lora_rank", 512), qk_nope_head_dim=_size(cfg, "qk_nope_head_dim", 128),
                    qk_rope_head_dim=rope_dim, v_head_dim=_size(cfg, "v_head_dim", 128),
                    q_lora_rank=_size(cfg, "q_lora_rank", 1536, optional=True), bias=bias)
    scale = _softmax_scale(cfg, mla.qk_head_dim)
    mla = replace(mla, scale=scale)
    moe, moe_layers = _moe(cfg)
    return LlamaConfig(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"], num_heads=heads,
        num_kv_heads=heads, mlp_hidden=cfg.get("intermediate_size", 18432),
        max_positions=rope_positions(cfg.get("max_position_embeddings", 4096), scaling),
        eps=norm_eps(cfg, "rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling, act="silu",
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), attention_bias=bias, mla=mla,
        attn_scale=scale, rope_layout="pairs_in" if interleave else "half", moe=moe, moe_layers=moe_layers,
    )


_LL = r"layers\.(\d+)\."
_AT = _LL + r"self_attn\."
DEEPSEEK_RULES = [
    (r"embed_tokens\.weight", "embed_tokens.weight"),
    (_LL + r"input_layernorm\.weight", _B + r"norm1.weight"),
    (_AT + r"q_proj\.weight", _B + r"attn.query.weight"),  # q_lora_rank null: one plain query projection
    (_AT + r"q_a_proj\.(weight|bias)", _B + r"attn.query_down.\2"),
    (_AT + r"q_a_layernorm\.weight", _B + r"attn.query_norm.weight"),
    (_AT + r"q_b_proj\.weight", _B + r"attn.query_up.weight"),
    (_AT + r"kv_a_proj_with_mqa\.(weight|bias)", _B + r"attn.kv_down.\2"),  # the latent and the shared k_rope
    (_AT + r"kv_a_layernorm\.weight", _B + r"attn.kv_norm.weight"),
    (_AT + r"kv_b_proj\.weight", _B + r"attn.kv_up.weight"),  # every head's k_nope and v from the latent
    (_AT + r"o_proj\.(weight|bias)", _B + r"attn.out.\2"),
    (_LL + r"post_attention_layernorm\.weight", _B + r"norm2.weight"),
    (_LL + r"mlp\.gate\.weight", _B + r"mlp.router.weight"),
    (_LL + r"mlp\.gate\.e_score_correction_bias", _B + r"mlp.router.choice_bias"),
    (_LL + r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", _B + r"mlp.experts.\2.\3.weight"),
    (_LL + r"mlp\.shared_experts\.(gate|up|down)_proj\.weight", _B + r"mlp.shared.\2.weight"),
    (_LL + r"mlp\.(gate|up|down)_proj\.weight", _B + r"mlp.\2.weight"),  # the dense layers' MLP
    (r"norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),  # untied only (see `decoder_head`)
]

_LAYER = re.compile(r"(?:model\.)?layers\.(\d+)\.")


def _mtp_layer(cfg: LlamaConfig, key: str) -> bool:
    """A tensor of a multi-token-prediction layer (num_nextn_predict_layers), numbered past num_hidden_layers
    (DeepSeek-V3's layer 61): left out, as transformers leaves it out."""
    m = _LAYER.match(key)
    return m is not None and int(m.group(1)) >= cfg.num_layers


# ModelInfo.note: what lazy runs of a long input keep (core.mla.LatentKeys), with DeepSeek-V3's own sizes
NOTE = ("multi-head latent attention: a lazy run keeps, per token and layer, the key latent and the shared "
        "rotated key (kv_lora_rank + qk_rope_head_dim numbers: 576 in DeepSeek-V3) instead of every head's key "
        "(heads × (qk_nope_head_dim + qk_rope_head_dim): 24,576, 42.7x more) and rebuilds the keys a tile needs")

ARCHITECTURES[FAMILY] = Architecture(FAMILY, "text", Llama, _deepseek_config, DEEPSEEK_RULES, ("model.",),
                                     ignore=(r"rotary_emb\.inv_freq",), note=NOTE, drop=_mtp_layer)
