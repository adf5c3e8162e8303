"""GLM-4 (GLM-4-0414), Cohere (Command R) and Cohere 2 (Command R7B) on the one Llama-style decoder.

GLM-4: four RMSNorms per block, a norm before and after each branch (our sandwich with its pre-norms:
input_layernorm, post_self_attn_layernorm, post_attention_layernorm before the MLP, post_mlp_layernorm),
RoPE on the first half of each head (partial_rotary_factor 0.5) with interleaved pairs, biases on q, k and
v only, gate and up fused in gate_up_proj.

Cohere and Cohere 2: LayerNorms with a weight and no bias, one norm read by both branches of a parallel
block (x + attn(ln(x)) + mlp(ln(x))), interleaved RoPE pairs, biases on q, k, v and W_O where
attention_bias, tied embeddings and logits times logit_scale; Command R+ (use_qk_norm) also normalises
each head's q and k with a bias-free LayerNorm of its own (a weight per head). Cohere 2 adds sliding windows
on 3 of every 4 layers (layer_types, or sliding_window_pattern) and RoPE on those local layers only: its
global layers see no positions at all.
"""
from __future__ import annotations

import math

from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, ATTENTION_RULES, B as _B, EMBED_RULE, FINAL_RULES,
                                               NORM1_RULE, QKV_RULES, Architecture, layer_types, layer_windows,
                                               norm_eps, rope_entry, window)
from attn_explorer.hub.families.decoders import ROPE_BUFFERS, rotary_decoder

# ---- GLM-4 --------------------------------------------------------------------------------------------------


def _glm4_config(cfg: dict) -> LlamaConfig:
    # transformers' Glm4Config defaults: head_dim 128 (not hidden_size / heads), 2 key/value heads (not one per
    # query head), 131072 positions, silu; RoPE on half of each head (rope_defaults)
    cfg = {"head_dim": 128, "num_key_value_heads": 2, "max_position_embeddings": 131072, "hidden_act": "silu", **cfg}
    d = cfg["head_dim"]
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise UserError(f"glm4: head_dim must be a whole number >= 1, got {d!r}")
    return rotary_decoder(cfg, "glm4", rope_defaults=dict(fraction=0.5), rope_layout="pairs",
                           eps=norm_eps(cfg, "rms_norm_eps", 1.5625e-07),
                           qkv_bias=bool(cfg.get("attention_bias", True)),  # none on o_proj
                           sandwich_norms=True, fused_gate_up=True)


_LL = r"layers\.(\d+)\."
GLM4_RULES = [
    EMBED_RULE,
    NORM1_RULE,
    *QKV_RULES,
    (_LL + r"self_attn\.o_proj\.weight", _B + r"attn.out.weight"),
    (_LL + r"post_self_attn_layernorm\.weight", _B + r"post_attn_norm.weight"),  # after the attention branch
    (_LL + r"post_attention_layernorm\.weight", _B + r"norm2.weight"),  # GLM's name for the norm before the MLP
    (_LL + r"post_mlp_layernorm\.weight", _B + r"post_mlp_norm.weight"),
    (_LL + r"mlp\.gate_up_proj\.weight", _B + r"mlp.gate_up.weight"),  # the gate's rows, then up's
    (_LL + r"mlp\.down_proj\.weight", _B + r"mlp.down.weight"),
    *FINAL_RULES,
]

# ---- Cohere (Command R) and Cohere 2 (Command R7B) ------------------------------------------------------------


def _number(cfg: dict, family: str, key: str, default: float) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise UserError(f"{family}: {key} must be a finite number, got {v!r}")
    return float(v)


def _cohere2_windows(cfg: dict) -> list:
    """Each layer's window: sliding_window on the 'sliding_attention' layers of layer_types (without it,
    all but every sliding_window_pattern-th layer, 4 by default), None on the others, as transformers does."""
    w = window(cfg, "cohere2", 4096)
    every = cfg.get("sliding_window_pattern", 4)
    if cfg.get("layer_types") is None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise UserError(f"cohere2: sliding_window_pattern must be a whole number >= 1, got {every!r}")
    types = layer_types(cfg, "cohere2", lambda n: ["sliding_attention" if (i + 1) % every else "full_attention"
                                                   for i in range(n)])
    return layer_windows(types, w)


def _cohere_config(cfg: dict) -> LlamaConfig:
    family = cfg.get("model_type")
    # transformers' Cohere rotates every dimension of each head: it reads no partial_rotary_factor
    # (with a scaled rope type it would fail) and ignores the rotary_pct Cohere's own configs carry
    for p in (cfg, rope_entry(cfg, family)[0]):
        f = p.get("partial_rotary_factor", 1.0)
        if f != 1.0:
            raise UserError(f"{family}: partial_rotary_factor {f!r} is not supported (Cohere turns all of each "
                            "head's dimensions)")
    if rope_entry(cfg, family)[1]:
        raise UserError(f"{family}: rope_parameters per layer type is not supported (transformers reads one entry)")
    cfg = {"hidden_act": "silu", "max_position_embeddings": 8192,  # CohereConfig's and Cohere2Config's defaults
           **{k: v for k, v in cfg.items() if k != "rotary_pct"}}
    fields = {}
    if family == "cohere2":
        cfg.pop("head_dim", None)  # Cohere2Config sets head_dim = hidden_size / heads, whatever config.json says
        windows = _cohere2_windows(cfg)
        fields = dict(sliding_windows=windows if any(windows) else None,
                      nope_layers=[w is None for w in windows])  # RoPE only where there is a window
        if not any(fields["nope_layers"]):
            fields["nope_layers"] = None
    return rotary_decoder(
        cfg, family,
        rope_defaults=dict(theta=10000.0 if family == "cohere2" else 500000.0), rope_layout="pairs",
        norm="layer_nobias", eps=norm_eps(cfg, "layer_norm_eps", 1e-5), parallel_residual=True,
        parallel_one_norm=True, rope_float32=True, attention_bias=bool(cfg.get("attention_bias", False)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        logit_scale=_number(cfg, family, "logit_scale", 0.0625),
        qk_norm_per_head=family == "cohere" and bool(cfg.get("use_qk_norm")), **fields)


COHERE_RULES = [
    EMBED_RULE,
    NORM1_RULE,  # the one norm both branches read
    *ATTENTION_RULES,
    (_LL + r"mlp\.(gate|up|down)_proj\.weight", _B + r"mlp.\2.weight"),
    (_LL + r"self_attn\.(q|k)_norm\.weight", _B + r"attn.\2_norm.weight"),  # Command R+: (heads, d_k), per head
    *FINAL_RULES,
]
_COHERE_NAMES = {"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                 "num_kv_heads": "num_key_value_heads", "mlp_hidden": "intermediate_size",
                 "max_positions": "max_position_embeddings", "eps": "layer_norm_eps"}

ARCHITECTURES["glm4"] = Architecture("glm4", "text", Llama, _glm4_config, GLM4_RULES, ("model.",),
                                     ignore=ROPE_BUFFERS)
for _mt in ("cohere", "cohere2"):
    ARCHITECTURES[_mt] = Architecture(_mt, "text", Llama, _cohere_config, COHERE_RULES, ("model.",),
                                      ignore=ROPE_BUFFERS, names=_COHERE_NAMES)
