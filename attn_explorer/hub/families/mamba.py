"""The Mamba-2 hybrids (core.mamba_hybrid): Granite 4 hybrid (granitemoehybrid: Mamba-2 or attention per layer,
MoE plus a shared MLP, Granite's multipliers, RoPE or none) and Falcon-H1 (falcon_h1: Mamba-2 and attention side
by side in every layer, muP multipliers). Both read their attention side through the public `rotary_decoder`."""
from __future__ import annotations

import dataclasses
import math

from attn_explorer.core.llama import LlamaConfig
from attn_explorer.core.mamba2 import Mamba2Config
from attn_explorer.core.mamba_hybrid import MambaHybrid, MambaHybridConfig
from attn_explorer.core.moe import MoEConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, ATTENTION_RULES, B as _B, EMBED_RULE, HEAD_RULE,
                                               NORM1_RULE, Architecture, act)
from attn_explorer.hub.families.decoders import ROPE_BUFFERS, rotary_decoder

GRANITE, FALCON = "granitemoehybrid", "falcon_h1"
MAMBA_KINDS = {"mamba": True, "linear_attention": True, "attention": False, "full_attention": False}


def _whole(cfg: dict, family: str, key: str, default, low: int = 1) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise UserError(f"{family}: {key} must be a whole number >= {low}, got {v!r}")
    return v


def _number(cfg: dict, family: str, key: str, default: float = 1.0) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise UserError(f"{family}: {key} must be a finite number, got {v!r}")
    return float(v)


def _numbers(cfg: dict, family: str, key: str, n: int) -> tuple:
    v = cfg.get(key)
    if v is None:
        return (1.0,) * n
    if not isinstance(v, list) or len(v) != n:
        raise UserError(f"{family}: {key} must list {n} numbers, got {v!r}")
    return tuple(_number({key: x}, family, key) for x in v)


def _dt_limit(cfg: dict, family: str) -> tuple[float, float]:
    """time_step_limit: [min, max]; transformers writes infinity as {"__float__": "Infinity"}."""
    v = cfg.get("time_step_limit")
    if v is None:
        return 0.0, float("inf")
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise UserError(f"{family}: time_step_limit must be [min, max], got {v!r}")
    out = []
    for x in v:
        if isinstance(x, dict) and set(x) == {"__float__"}:
            x = {"Infinity": math.inf, "-Infinity": -math.inf}.get(x["__float__"], x["__float__"])
        if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isnan(x):
            raise UserError(f"{family}: time_step_limit must be two numbers, got {v!r}")
        out.append(float(x))
    if out[0] < 0 or out[0] > out[1]:
        raise UserError(f"{family}: time_step_limit must be 0 <= min <= max, got {v!r}")
    return out[0], out[1]


def _mamba(cfg: dict, family: str, inner: int, **fields) -> Mamba2Config:
    heads = _whole(cfg, family, "mamba_n_heads", 128)
    head_dim = cfg.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim == "auto" else _whole(cfg, family, "mamba_d_head", None)
    if heads * head_dim != inner:
        raise UserError(f"{family}: mamba_n_heads ({heads}) x mamba_d_head ({head_dim}) must equal the Mamba-2 width "
                        f"({inner})")
    groups = _whole(cfg, family, "mamba_n_groups", 1)
    if heads % groups:
        raise UserError(f"{family}: mamba_n_groups ({groups}) must divide mamba_n_heads ({heads})")
    lo, hi = _dt_limit(cfg, family)
    return Mamba2Config(
        dim=cfg["hidden_size"], num_heads=heads, head_dim=head_dim, state_size=_whole(cfg, family, "mamba_d_state", 256),
        n_groups=groups, conv_kernel=_whole(cfg, family, "mamba_d_conv", 4),
        chunk_size=_whole(cfg, family, "mamba_chunk_size", 256), conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        proj_bias=bool(cfg.get("mamba_proj_bias", False)), act=act(cfg, "hidden_act", "silu"),
        eps=_number(cfg, family, "rms_norm_eps", 1e-6), dt_min=lo, dt_max=hi, family=family, **fields)


def _hybrid(base: LlamaConfig, **fields) -> MambaHybridConfig:
    return MambaHybridConfig(**{f.name: getattr(base, f.name) for f in dataclasses.fields(LlamaConfig)}, **fields)


def _granite4_config(cfg: dict) -> MambaHybridConfig:
    f = GRANITE
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * n
    if not isinstance(types, list) or len(types) != n or any(t not in MAMBA_KINDS for t in types):
        raise UserError(f"{f}: layer_types must list 'mamba' or 'attention' per layer ({n}), got {types!r}")
    pos = cfg.get("position_embedding_type")
    if pos not in (None, "rope", "nope"):
        raise UserError(f"{f}: position_embedding_type {pos!r} is not supported (only 'rope' or none)")
    mamba = _mamba(cfg, f, _whole(cfg, f, "mamba_expand", 2) * cfg["hidden_size"],
                   out_bias=bool(cfg.get("mamba_proj_bias", False)), norm="gate_first", norm_rounds=True)
    experts = _whole(cfg, f, "num_local_experts", 8, low=0)
    shared = _whole(cfg, f, "shared_intermediate_size", 1024)
    moe = None
    if experts:
        k = _whole(cfg, f, "num_experts_per_tok", 2)
        if k > experts:
            raise UserError(f"{f}: num_experts_per_tok ({k}) is more than num_local_experts ({experts})")
        moe = MoEConfig(num_experts=experts, top_k=k, hidden=cfg["intermediate_size"], scoring="topk_softmax",
                        shared_hidden=shared)
    base = rotary_decoder(
        cfg, f, rope_defaults=dict(theta=10000.0), attention_bias=bool(cfg.get("attention_bias", False)),
        eps=_number(cfg, f, "rms_norm_eps", 1e-6), mlp_hidden=shared, moe=moe,
        embed_multiplier=_number(cfg, f, "embedding_multiplier"), attn_scale=_number(cfg, f, "attention_multiplier"),
        residual_multiplier=_number(cfg, f, "residual_multiplier"),
        logits_divisor=_number(cfg, f, "logits_scaling"), nope_layers=None if pos == "rope" else [True] * n)
    return _hybrid(base, family=f, mamba=mamba, mamba_layers=[MAMBA_KINDS[t] for t in types], shared_mlp=True)


def _falcon_h1_config(cfg: dict) -> MambaHybridConfig:
    f = FALCON
    inner = cfg.get("mamba_d_ssm", 1024)
    inner = _whole(cfg, f, "mamba_expand", 2) * cfg["hidden_size"] if inner is None else _whole(cfg, f, "mamba_d_ssm", 0)
    rms = bool(cfg.get("mamba_rms_norm", False))
    norm = ("norm_first" if cfg.get("mamba_norm_before_gate", True) else "gate_first") if rms else "gate_only"
    mamba = _mamba(cfg, f, inner, out_bias=bool(cfg.get("projectors_bias", False)), norm=norm,
                   in_scale=_number(cfg, f, "ssm_in_multiplier"), mup=_numbers(cfg, f, "ssm_multipliers", 5),
                   out_scale=_number(cfg, f, "ssm_out_multiplier"))
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    base = rotary_decoder(
        cfg, f, attention_bias=bool(cfg.get("attention_bias", False)), mlp_bias=bool(cfg.get("mlp_bias", False)),
        eps=_number(cfg, f, "rms_norm_eps", 1e-5), num_kv_heads=cfg.get("num_key_value_heads") or 8,
        max_positions=cfg.get("max_position_embeddings", 8192),
        # keys times key_multiplier: the logits' scale carries it
        attn_scale=_number(cfg, f, "key_multiplier") / math.sqrt(head_dim),
        embed_multiplier=_number(cfg, f, "embedding_multiplier"), logit_scale=_number(cfg, f, "lm_head_multiplier"))
    return _hybrid(base, family=f, mamba=mamba, parallel_mamba=True,
                   attn_in_multiplier=_number(cfg, f, "attention_in_multiplier"),
                   attn_out_multiplier=_number(cfg, f, "attention_out_multiplier"),
                   mlp_multipliers=_numbers(cfg, f, "mlp_multipliers", 2))


_LL = r"layers\.(\d+)\."
def _attention(prefix: str) -> list:
    return ATTENTION_RULES + [
        (_LL + r"mamba\.(in_proj|out_proj|conv1d)\.(weight|bias)", _B + prefix + r"\2.\3"),
        (_LL + r"mamba\.(A_log|D|dt_bias)", _B + prefix + r"\2"),
        (_LL + r"mamba\.norm\.weight", _B + prefix + "norm.weight"),
        EMBED_RULE,
        NORM1_RULE,
        HEAD_RULE,
    ]


GRANITE_RULES = _attention("attn.") + [
    (_LL + r"post_attention_layernorm\.weight", _B + r"norm2.weight"),
    # the experts as checkpoints store them, and as transformers' own classes name them
    (_LL + r"block_sparse_moe\.(?:input_linear\.weight|experts\.gate_up_proj)", _B + r"mlp.experts.gate_up"),
    (_LL + r"block_sparse_moe\.(?:output_linear\.weight|experts\.down_proj)", _B + r"mlp.experts.down"),
    (_LL + r"block_sparse_moe\.router\.(?:layer\.)?weight", _B + r"mlp.router.weight"),
    (_LL + r"shared_mlp\.input_linear\.weight", _B + r"mlp.shared.gate_up.weight"),
    (_LL + r"shared_mlp\.output_linear\.weight", _B + r"mlp.shared.down.weight"),
    (r"norm\.weight", "norm.weight"),
]
FALCON_RULES = _attention("mamba.") + [
    (_LL + r"pre_ff_layernorm\.weight", _B + r"norm2.weight"),
    (_LL + r"feed_forward\.(gate|up|down)_proj\.(weight|bias)", _B + r"mlp.\2.\3"),
    (r"final_layernorm\.weight", "norm.weight"),
]

ARCHITECTURES.update({
    GRANITE: Architecture(GRANITE, "text", MambaHybrid, _granite4_config, GRANITE_RULES, ("model.",),
                          ignore=ROPE_BUFFERS),
    FALCON: Architecture(FALCON, "text", MambaHybrid, _falcon_h1_config, FALCON_RULES, ("model.",),
                         ignore=ROPE_BUFFERS + (r"layers\.\d+\.mamba\.mup_vector",),
                         note="Falcon-H1: the maps are its softmax attention's; its Mamba-2 mixers' implicit maps "
                              "are not drawn"),
})
