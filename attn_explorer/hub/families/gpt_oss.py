"""gpt-oss (openai/gpt-oss-20b, -120b): the Llama decoder with learned attention sinks (one logit per head
that joins every row's softmax: core.sinks), biases on q, k, v and W_O, sliding-window layers (128
tokens) alternating with global ones (layer_types), YaRN RoPE over the first and second halves of each
head (rotate-half pairs, not interleaved), and a mixture-of-experts MLP on every layer: a biased router
picks the top-k logits and softmaxes them, each expert a biased, clamped SwiGLU (core.moe's
"topk_softmax" router and "clamped_swiglu" experts, stacked as the checkpoint stores them)."""
from __future__ import annotations

import math

from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.moe import MoEConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, ATTENTION_RULES, B as _B, EMBED_RULE, FINAL_RULES,
                                               NORM1_RULE, Architecture, layer_types, layer_windows, norm_eps, window)
from attn_explorer.hub.families.decoders import ROPE_BUFFERS, rotary_decoder

FAMILY = "gpt_oss"
# transformers' GptOssConfig when config.json names no RoPE: YaRN stretching 4,096 positions 32 times
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def _whole(cfg: dict, *keys: str) -> int:
    """The first of keys config.json has (num_local_experts / num_experts, ...): a whole number >= 1."""
    key = next((k for k in keys if cfg.get(k) is not None), keys[0])
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise UserError(f"{FAMILY}: {key} must be a whole number >= 1, got {v!r}")
    return v


def _number(cfg: dict, key: str, default: float) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise UserError(f"{FAMILY}: {key} must be a finite number > 0, got {v!r}")
    return float(v)


def _moe(cfg: dict) -> MoEConfig:
    experts = _whole(cfg, "num_local_experts", "num_experts")
    top_k = _whole(cfg, "num_experts_per_tok", "experts_per_token")
    if top_k > experts:
        raise UserError(f"{FAMILY}: num_experts_per_tok ({top_k}) is more than num_local_experts ({experts})")
    return MoEConfig(num_experts=experts, top_k=top_k, hidden=_whole(cfg, "intermediate_size"),
                     scoring="topk_softmax", router_bias=True, act="clamped_swiglu",
                     alpha=_number(cfg, "swiglu_alpha", 1.702), limit=_number(cfg, "swiglu_limit", 7.0),
                     expert_bias=True, stacked=True, interleaved=True)


def _gpt_oss_config(cfg: dict) -> LlamaConfig:
    quant = cfg.get("quantization_config")
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise UserError(f"{FAMILY}: quantised weights (quantization_config {method!r}) are not supported; load an "
                        "unquantised copy (bf16 or float32), e.g. one saved by transformers with "
                        "Mxfp4Config(dequantize=True)")
    if not cfg.get("rope_parameters") and not cfg.get("rope_scaling"):
        cfg = {**cfg, "rope_parameters": {**DEFAULT_ROPE, "rope_theta": cfg.get("rope_theta", 150000.0)}}
    # transformers' default layer_types: sliding on even layers, full on odd ones
    types = layer_types(cfg, FAMILY, lambda n: ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                                for i in range(n)])
    windows = layer_windows(types, window(cfg, FAMILY, default=128))
    return rotary_decoder(cfg, FAMILY, rope_defaults=dict(theta=150000.0), eps=norm_eps(cfg, "rms_norm_eps", 1e-5),
                           attention_bias=bool(cfg.get("attention_bias", True)), attn_sinks=True,
                           sliding_windows=windows if any(windows) else None, moe=_moe(cfg))


_LL = r"layers\.(\d+)\."
GPT_OSS_RULES = [
    EMBED_RULE,
    NORM1_RULE,
    *ATTENTION_RULES,
    (_LL + r"self_attn\.sinks", _B + r"attn.sinks"),  # (H,): each head's sink logit
    (_LL + r"post_attention_layernorm\.weight", _B + r"norm2.weight"),
    (_LL + r"mlp\.router\.(weight|bias)", _B + r"mlp.router.\2"),
    # (E, D, 2I) in x @ W layout, gate and up in alternating columns; (E, I, D); their biases
    (_LL + r"mlp\.experts\.gate_up_proj", _B + r"mlp.experts.gate_up"),
    (_LL + r"mlp\.experts\.gate_up_proj_bias", _B + r"mlp.experts.gate_up_bias"),
    (_LL + r"mlp\.experts\.down_proj", _B + r"mlp.experts.down"),
    (_LL + r"mlp\.experts\.down_proj_bias", _B + r"mlp.experts.down_bias"),
    *FINAL_RULES,
]

ARCHITECTURES[FAMILY] = Architecture(FAMILY, "text", Llama, _gpt_oss_config, GPT_OSS_RULES, ("model.",),
                                     ignore=ROPE_BUFFERS)
