"""Gemma 2 and Gemma 3 (text, and Gemma 3's multimodal checkpoints' language model): the Llama decoder
with Gemma's switches set (soft-capping, local and global layers, (1+w) sandwich norms, scaled embeddings,
GeGLU, QK-norm on Gemma 3)."""
from __future__ import annotations

from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.positional import RopeScaling
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, ATTENTION_RULES, B as _B, EMBED_RULE, FINAL_RULES,
                                               NORM1_RULE, Architecture, act, layer_types, layer_windows, norm_eps,
                                               rope, rope_entry, rope_positions, window)

_LL = r"layers\.(\d+)\."
_GEMMA_DEFAULTS = {  # transformers' config defaults, where config.json may leave a field out
    "gemma2": dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=8192,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rope_theta=10000.0),
    "gemma3_text": dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=131072,
                        final_logit_softcapping=None, rope_theta=1_000_000.0, rope_local_base_freq=10000.0),
}

# transformers' defaults of the sizes, which Gemma 3's image-text checkpoints (gemma-3-4b/12b/27b) leave out of
# text_config where they equal them: heads, key-value heads and the vocabulary are not written there
_GEMMA_SIZES = dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                    num_key_value_heads=4)
_GEMMA_VOCAB = {"gemma2": 256000, "gemma3_text": 262208}


def _gemma_layer_types(cfg: dict, family: str) -> list[str]:
    """config.json's layer_types, or transformers' default pattern: Gemma 2 alternates local and global
    (every 2nd layer global); Gemma 3 has sliding_window_pattern - 1 local layers to 1 global (6 by default)."""
    every = 2 if family == "gemma2" else int(cfg.get("sliding_window_pattern") or 6)
    return layer_types(cfg, family, lambda n: ["sliding_attention" if (i + 1) % every else "full_attention"
                                               for i in range(n)])


def _gemma_rope(cfg: dict, family: str, head_dim: int) -> tuple[float, RopeScaling, float | None, RopeScaling]:
    """(global base, global scaling, local base or None, local scaling) through the shared RoPE reader:
    transformers 5's rope_parameters (Gemma 3 keeps one entry per layer type), or the older rope_theta /
    rope_scaling (the global layers' only) / rope_local_base_freq."""
    d = _GEMMA_DEFAULTS[family]
    theta, fraction, scaling = rope(cfg, family, head_dim, theta=d["rope_theta"])
    local_theta, local_scaling, local_fraction = None, RopeScaling(), 1.0
    if family == "gemma3_text":
        local_theta = float(cfg.get("rope_local_base_freq", d["rope_local_base_freq"]))
        if rope_entry(cfg, family)[1]:  # one entry per layer type
            local_theta, local_fraction, local_scaling = rope(cfg, family, head_dim, theta=local_theta,
                                                              layer_kind="sliding_attention")
    if fraction != 1.0 or local_fraction != 1.0:
        raise UserError(f"{family} with partial_rotary_factor is not supported")
    return theta, scaling, local_theta, local_scaling


def _gemma_config(cfg: dict) -> LlamaConfig:
    multimodal = cfg.get("model_type") == "gemma3"
    if multimodal:  # the multimodal config: its language model is text_config
        cfg = dict(cfg.get("text_config") or {})
        cfg.setdefault("model_type", "gemma3_text")
    family = cfg.get("model_type")
    if family not in _GEMMA_DEFAULTS:
        raise UserError(f"Gemma model_type {family!r} is not supported (gemma2, gemma3_text, gemma3)")
    d = _GEMMA_DEFAULTS[family]
    cfg = {**_GEMMA_SIZES, "vocab_size": _GEMMA_VOCAB[family], **cfg}
    if cfg.get("use_bidirectional_attention"):
        raise UserError("Gemma with use_bidirectional_attention (an encoder such as EmbeddingGemma) is not supported")
    activation = act({"hidden_act": cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"})
    heads = cfg["num_attention_heads"]
    w = window(cfg, family, d["sliding_window"])
    types = _gemma_layer_types(cfg, family)
    head_dim = cfg.get("head_dim", d["head_dim"])
    theta, scaling, local_theta, local_scaling = _gemma_rope(cfg, family, head_dim)
    # Gemma3ForConditionalGeneration's head applies no final soft-cap (the checkpoints set none anyway)
    softcap = None if multimodal else cfg.get("final_logit_softcapping", d["final_logit_softcapping"])
    return LlamaConfig(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        mlp_hidden=cfg["intermediate_size"],
        max_positions=rope_positions(cfg.get("max_position_embeddings", d["max_position_embeddings"]), scaling),
        eps=norm_eps(cfg, "rms_norm_eps", 1e-6), rope_theta=theta,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        attention_bias=bool(cfg.get("attention_bias", False)), head_size=head_dim, norm="rms1p", act=activation,
        sandwich_norms=True, scale_embeddings=True, qk_norm=family == "gemma3_text",
        attn_scale=float(cfg.get("query_pre_attn_scalar", d["query_pre_attn_scalar"])) ** -0.5,
        # transformers' Gemma 3 attention never applies attn_logit_softcapping, so neither do we
        attn_softcap=cfg.get("attn_logit_softcapping", d["attn_logit_softcapping"]) if family == "gemma2" else None,
        final_softcap=None if softcap is None else float(softcap),
        sliding_windows=layer_windows(types, w),
        rope_local_theta=local_theta, rope_scaling=scaling, rope_local_scaling=local_scaling,
    )


GEMMA_RULES = [
    EMBED_RULE,
    NORM1_RULE,
    (_LL + r"post_attention_layernorm\.weight", _B + r"post_attn_norm.weight"),  # not Llama's pre-MLP norm
    (_LL + r"pre_feedforward_layernorm\.weight", _B + r"norm2.weight"),
    (_LL + r"post_feedforward_layernorm\.weight", _B + r"post_mlp_norm.weight"),
    *ATTENTION_RULES,
    (_LL + r"self_attn\.(q|k)_norm\.weight", _B + r"attn.\2_norm.weight"),  # Gemma 3
    (_LL + r"mlp\.(gate|up|down)_proj\.(weight|bias)", _B + r"mlp.\2.\3"),
    *FINAL_RULES,
]
for _mt in ("gemma2", "gemma3_text"):
    ARCHITECTURES[_mt] = Architecture(_mt, "text", Llama, _gemma_config, GEMMA_RULES, ("model.",))
# Gemma 3's multimodal checkpoints (model_type gemma3): the language model only; the SigLIP tower and
# its projector are left out, so the app shows the text attention of an image-text model.
ARCHITECTURES["gemma3"] = Architecture(
    "gemma3_text", "text", Llama, _gemma_config, GEMMA_RULES,
    ("model.language_model.", "language_model.model.", "model."),
    ignore=(r"vision_tower\..*", r"multi_modal_projector\..*"),
    note="Gemma 3's language model only: the vision tower and its projector are not loaded",
)

