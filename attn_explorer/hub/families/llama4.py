"""Llama 4's language model (model_type llama4_text, Llama4ForCausalLM; and the multimodal llama4, whose
text_config is read and whose language model alone is loaded): the Llama decoder with RoPE on interleaved
pairs (rope_layout "pairs"), every no_rope_layer_interval-th layer without RoPE (NoPE), chunked local
attention on the RoPE layers (attention_chunk_size), q and k over their RMS after RoPE on the RoPE layers
(use_qk_norm), the NoPE layers' queries tuned by position (attn_temperature_tuning, floor_scale,
attn_scale), and MoE layers (moe_layers / interleave_moe_layer_step: a top-1 sigmoid router scaling the
expert's input, plus a shared expert) between dense ones (intermediate_size_mlp)."""
from __future__ import annotations

import math

from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.moe import MoEConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, ATTENTION_RULES, B as _B, EMBED_RULE, FINAL_RULES,
                                               NORM1_RULE, Architecture)
from attn_explorer.hub.families.decoders import ROPE_BUFFERS, rotary_decoder

F = "llama4"


def _count(cfg: dict, key: str, default, low: int = 1) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise UserError(f"{F}: {key} must be a whole number >= {low}, got {v!r}")
    return v


def _per_layer(cfg: dict, key: str, n: int, default: list[int]) -> list[int]:
    """no_rope_layers (1 = RoPE, 0 = none) per layer, transformers' default where absent or empty."""
    flags = cfg.get(key) or default
    if not isinstance(flags, list) or len(flags) < n or any(f not in (0, 1) or isinstance(f, float) for f in flags):
        raise UserError(f"{F}: {key} must list 1 (RoPE) or 0 (none) for each of the {n} layers, got {flags!r}")
    return [int(f) for f in flags[:n]]


def _moe_layers(cfg: dict, n: int) -> list[bool]:
    """Per layer, True where its MLP is routed experts: moe_layers, or every interleave_moe_layer_step-th."""
    listed = cfg.get("moe_layers")
    if listed is None:
        step = _count(cfg, "interleave_moe_layer_step", 1)
        listed = list(range(step - 1, n, step))
    if not isinstance(listed, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in listed):
        raise UserError(f"{F}: moe_layers must list layer numbers, got {listed!r}")
    return [i in listed for i in range(n)]


def _chunked(cfg: dict, rope_on: list[int], chunk: int | None) -> list[bool]:
    """Per layer, True where attention is chunked: layer_types' 'chunked_attention', or, without
    layer_types, the RoPE layers where attention_chunk_size is set (transformers' default)."""
    n = len(rope_on)
    types = cfg.get("layer_types")
    if types is None:
        return [bool(r) and chunk is not None for r in rope_on]
    if not isinstance(types, list) or len(types) != n:
        raise UserError(f"{F}: layer_types must list one kind per layer ({n}), got {types!r}")
    unknown = sorted({str(t) for t in types} - {"chunked_attention", "full_attention"})
    if unknown:
        raise UserError(f"{F}: layer type {unknown[0]!r} is not supported (only chunked_attention and full_attention)")
    if chunk is None and "chunked_attention" in types:
        raise UserError(f"{F}: layer_types has chunked_attention layers but attention_chunk_size is null")
    return [t == "chunked_attention" for t in types]


def _positive(cfg: dict, key: str, default: float) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise UserError(f"{F}: {key} must be a number > 0, got {v!r}")
    return float(v)


def _llama4_config(cfg: dict) -> LlamaConfig:
    if cfg.get("model_type") == "llama4":  # the multimodal config: its language model is text_config
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise UserError(f"{F}: the multimodal config needs a text_config object, got {text!r}")
        cfg = dict(text)
    n = _count(cfg, "num_hidden_layers", None)
    heads = _count(cfg, "num_attention_heads", None)
    cfg = {"intermediate_size_mlp": 16384, "head_dim": 128, "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5,
           **cfg,
           "hidden_act": cfg.get("hidden_act", "silu")}
    cfg["head_dim"] = cfg["head_dim"] or cfg["hidden_size"] // heads
    every = _count(cfg, "no_rope_layer_interval", 4)
    rope_on = _per_layer(cfg, "no_rope_layers", n, [int((i + 1) % every != 0) for i in range(n)])
    chunk = cfg.get("attention_chunk_size", 8192)
    if chunk is not None:
        chunk = _count(cfg, "attention_chunk_size", 8192)
    chunked = _chunked(cfg, rope_on, chunk)
    moe_at = _moe_layers(cfg, n)
    moe = None
    if any(moe_at):
        experts = _count(cfg, "num_local_experts", 16)
        moe = MoEConfig(num_experts=experts, top_k=_count(cfg, "num_experts_per_tok", 1),
                        hidden=_count(cfg, "intermediate_size", None), scoring="sigmoid", weight_input=True,
                        shared_hidden=cfg["intermediate_size"], stacked=True)
        if moe.top_k > experts:
            raise UserError(f"{F}: num_experts_per_tok ({moe.top_k}) exceeds num_local_experts ({experts})")
    tuning = None
    if cfg.get("attn_temperature_tuning", True):
        tuning = (_positive(cfg, "floor_scale", 8192), _positive(cfg, "attn_scale", 0.1))
    nope = [not r for r in rope_on]
    return rotary_decoder(
        {**cfg, "intermediate_size": cfg["intermediate_size_mlp"]}, F, rope_defaults=dict(theta=500000.0),
        attention_bias=bool(cfg.get("attention_bias", False)), rope_layout="pairs",
        nope_layers=nope if any(nope) else None, attention_chunk=chunk if any(chunked) else None,
        chunked_layers=chunked if any(chunked) else None, qk_rms_after_rope=bool(cfg.get("use_qk_norm", True)),
        temperature_tuning=tuning if any(nope) else None, moe=moe, moe_layers=moe_at if moe else None,
    )


_LL = r"layers\.(\d+)\."
_FF = _LL + r"feed_forward\."
LLAMA4_RULES = [
    EMBED_RULE,
    NORM1_RULE,
    *ATTENTION_RULES,
    (_LL + r"post_attention_layernorm\.weight", _B + r"norm2.weight"),
    (_FF + r"(gate|up|down)_proj\.weight", _B + r"mlp.\2.weight"),  # a dense layer (intermediate_size_mlp)
    (_FF + r"router\.weight", _B + r"mlp.router.weight"),  # an MoE layer: (E, D)
    (_FF + r"experts\.gate_up_proj", _B + r"mlp.experts.gate_up"),  # (E, D, 2I): gate's columns, then up's
    (_FF + r"experts\.down_proj", _B + r"mlp.experts.down"),  # (E, I, D)
    (_FF + r"shared_expert\.(gate|up|down)_proj\.weight", _B + r"mlp.shared.\2.weight"),
    *FINAL_RULES,
]
ARCHITECTURES["llama4_text"] = Architecture("llama4_text", "text", Llama, _llama4_config, LLAMA4_RULES, ("model.",),
                                            ignore=ROPE_BUFFERS)
# the multimodal checkpoint (Llama4ForConditionalGeneration): its language model only
ARCHITECTURES["llama4"] = Architecture(
    "llama4_text", "text", Llama, _llama4_config, LLAMA4_RULES, ("language_model.model.", "language_model.", "model."),
    ignore=(r"vision_model\..*", r"multi_modal_projector\..*", *ROPE_BUFFERS),
    note="Llama 4's language model only: the vision tower and its projector are not loaded",
)
