"""Gemma 4 (gemma4_text, and the language model of the multimodal gemma4 checkpoints): core/gemma4.py's
decoder, read from Gemma4TextConfig's fields as transformers reads them (its defaults where config.json
leaves a field out). The vision and audio towers of a gemma4 checkpoint are not loaded."""
from __future__ import annotations

from attn_explorer.core.gemma4 import Gemma4, Gemma4Config
from attn_explorer.core.moe import MoEConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, ATTENTION_RULES, B as _B, EMBED_RULE, FINAL_RULES,
                                               NORM1_RULE, Architecture, act, json_kind, layer_types, norm_eps, rope,
                                               rope_fields, rope_kind, window)

F = "gemma4_text"
# config.json's names of our fields, for messages (convert.HF_NAMES["LlamaConfig"]; convert imports this module)
_NAMES = {"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
          "num_kv_heads": "num_key_value_heads", "mlp_hidden": "intermediate_size",
          "max_positions": "max_position_embeddings", "eps": "rms_norm_eps"}
# transformers' rope_parameters when config.json has none
_ROPE_DEFAULT = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                    "rope_theta": 1_000_000.0}}


def _whole(cfg: dict, key: str, default, low: int = 1):
    v = cfg.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise UserError(f"{F}: {key} must be a whole number >= {low}, got {v!r}")
    return v


def _types(cfg: dict) -> list[str]:
    """layer_types (5 sliding : 1 full by default), the last layer made full, as transformers does."""
    types = list(layer_types(cfg, F, lambda n: ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                                for i in range(n)]))
    types[-1] = "full_attention"
    return types


def _layer_shapes(cfg: dict, types: list[str]) -> tuple[int, int | None]:
    """(the global layers' d_k, their key/value heads or None): per_layer_config where config.json has one
    (transformers 5.24 saves it, keyed by layer), else global_head_dim (512) and, with attention_k_eq_v,
    num_global_key_value_heads."""
    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    head_dim = _whole(cfg, "global_head_dim", 512)
    kv = _whole(cfg, "num_global_key_value_heads", None) if k_eq_v else None
    per_layer = cfg.get("per_layer_config")
    if per_layer is None:
        return head_dim, kv
    if not isinstance(per_layer, dict):
        raise UserError(f"{F}: per_layer_config must be an object, not {json_kind(per_layer)}")
    seen = set()
    for key, over in per_layer.items():
        if not str(key).isdigit() or int(key) >= len(types) or not isinstance(over, dict):
            raise UserError(f"{F}: per_layer_config's {key!r} must be a layer number with an object")
        extra = sorted(set(over) - {"head_dim", "num_key_value_heads"})
        if extra or types[int(key)] != "full_attention":
            raise UserError(f"{F}: per_layer_config other than the global layers' head_dim / num_key_value_heads "
                            f"is not supported (layer {key}: {extra[0] if extra else types[int(key)]})")
        seen.add((_whole(over, "head_dim", cfg.get("head_dim", 256)), _whole(over, "num_key_value_heads", None)))
    if len(seen) > 1:
        raise UserError(f"{F}: per_layer_config gives the global layers different shapes: not supported")
    return next(iter(seen)) if seen else (cfg.get("head_dim", 256), None)


def _rope(cfg: dict, local_dim: int, global_dim: int):
    """(global base, global scaling, local base, local scaling) from rope_parameters, one entry per layer type
    (transformers' Gemma 4 reads no legacy rope_theta / rope_scaling, and no flat rope_parameters)."""
    if cfg.get("rope_scaling") is not None or "rope_theta" in cfg:
        raise UserError(f"{F}: rope_scaling / rope_theta are not read by transformers' Gemma 4; give "
                        "rope_parameters per layer type (full_attention, sliding_attention)")
    params = rope_fields(cfg, F)[0] or _ROPE_DEFAULT
    if not all(isinstance(params.get(t), dict) for t in ("full_attention", "sliding_attention")):
        raise UserError(f"{F}: rope_parameters must have a full_attention and a sliding_attention entry")
    out = []
    for kind, dim in (("full_attention", global_dim), ("sliding_attention", local_dim)):
        if rope_kind(params[kind]) not in ("default", "proportional"):
            raise UserError(f"{F}: rope type {rope_kind(params[kind])!r} on {kind} layers is not supported "
                            "(default, proportional)")
        theta, fraction, scaling = rope({"rope_parameters": params, "max_position_embeddings":
                                         cfg.get("max_position_embeddings", 131072)}, F, dim, layer_kind=kind)
        if fraction != 1.0:  # transformers' default RoPE in Gemma 4 turns all of d_k whatever the factor says
            raise UserError(f"{F}: partial_rotary_factor on a {kind} entry of rope type 'default' is not supported")
        out += [theta, scaling]
    return tuple(out)


def _kv_sources(types: list[str], shared: int) -> list | None:
    """Per layer, the layer whose keys and values it reads: the last n layers each read the last earlier
    layer of their own type (transformers' kv_sharing_modes); None for the others."""
    n = len(types)
    if not shared:
        return None
    first = n - shared
    if first <= 0:
        raise UserError(f"{F}: num_kv_shared_layers {shared} leaves no layer to make keys and values")
    last = {t: i for i, t in enumerate(types[:first])}
    if set(types) - set(last):
        raise UserError(f"{F}: num_kv_shared_layers {shared}: a shared layer type has no earlier layer to read")
    return [None if i < first else last[t] for i, t in enumerate(types)]


def _moe(cfg: dict) -> MoEConfig | None:
    """enable_moe_block (26B-A4B): num_experts experts of moe_intermediate_size, top_k_experts per token."""
    if not cfg.get("enable_moe_block"):
        return None
    hidden = cfg.get("moe_intermediate_size") or cfg.get("expert_intermediate_size")
    fields = {"num_experts": cfg.get("num_experts"), "top_k_experts": cfg.get("top_k_experts"),
              "moe_intermediate_size": hidden}
    for key, v in fields.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"{F} with enable_moe_block needs {key} (a whole number >= 1), got {v!r}")
    if fields["top_k_experts"] > fields["num_experts"]:
        raise UserError(f"{F}: top_k_experts {fields['top_k_experts']} > num_experts {fields['num_experts']}")
    # the experts' activation is the model's (hidden_activation): Gemma4MoE.expert, not MoEConfig.act
    return MoEConfig(num_experts=fields["num_experts"], top_k=fields["top_k_experts"], hidden=hidden,
                     scoring="softmax", norm_topk=True)


def _gemma4_config(cfg: dict) -> Gemma4Config:
    multimodal = cfg.get("model_type") == "gemma4"
    top = cfg
    if multimodal:  # the multimodal config: its language model is text_config
        cfg = dict(cfg.get("text_config") or {})
    if cfg.get("use_bidirectional_attention") not in (None, "vision"):  # "vision": only image tokens see ahead
        raise UserError(f"{F} with use_bidirectional_attention {cfg['use_bidirectional_attention']!r} is not supported")
    heads = cfg["num_attention_heads"]
    head_dim = _whole(cfg, "head_dim", 256)
    types = _types(cfg)
    w = window(cfg, F, 512)
    if w is None:
        raise UserError(f"{F}: sliding_window must be a whole number >= 1, got null")
    global_dim, global_kv = _layer_shapes(cfg, types)
    theta, scaling, local_theta, local_scaling = _rope(cfg, head_dim, global_dim)
    ple = _whole(cfg, "hidden_size_per_layer_input", 256, low=0) or None
    vocab = cfg.get("vocab_size", 262_144)
    ple_vocab = _whole(cfg, "vocab_size_per_layer_input", 262_144) if ple else None
    if ple and ple_vocab < vocab:
        raise UserError(f"{F}: vocab_size_per_layer_input {ple_vocab} < vocab_size {vocab}: the tokens past it "
                        "have no per-layer embedding")
    softcap = cfg.get("final_logit_softcapping")
    tie = top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
    return Gemma4Config(
        vocab_size=vocab, dim=cfg.get("hidden_size", 2304), num_layers=len(types), num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", 4), mlp_hidden=cfg.get("intermediate_size", 9216),
        max_positions=cfg.get("max_position_embeddings", 131_072), eps=norm_eps(cfg, "rms_norm_eps", 1e-6),
        rope_theta=theta, tie_embeddings=bool(tie), attention_bias=bool(cfg.get("attention_bias", False)),
        head_size=head_dim, norm="rms",
        act=act({"hidden_act": cfg.get("hidden_activation") or "gelu_pytorch_tanh"}),
        sandwich_norms=True, scale_embeddings=True, qk_norm=True, attn_scale=1.0,
        final_softcap=None if softcap is None else float(softcap),
        sliding_windows=[w if t == "sliding_attention" else None for t in types],
        rope_local_theta=local_theta, rope_scaling=scaling, rope_local_scaling=local_scaling,
        local_layers=[t == "sliding_attention" for t in types], global_head_dim=global_dim,
        global_kv_heads=global_kv, k_eq_v=bool(cfg.get("attention_k_eq_v", False)),
        kv_source=_kv_sources(types, _whole(cfg, "num_kv_shared_layers", 0, low=0)),
        wide_mlp=bool(cfg.get("use_double_wide_mlp", False)), per_layer_dim=ple, per_layer_vocab=ple_vocab,
        moe=_moe(cfg),
        # the multimodal model embeds its placeholders (no image or audio here) as the padding token
        placeholder_ids=[top.get(k, d) for k, d in (("image_token_id", 258_880), ("video_token_id", 258_884),
                                                    ("audio_token_id", 258_881)) if top.get(k, d) is not None]
        if multimodal else None,
        placeholder_pad=_whole(cfg, "pad_token_id", 0, low=0) if multimodal else None,
    )


_LL = r"layers\.(\d+)\."
GEMMA4_RULES = [
    EMBED_RULE,
    (r"embed_tokens_per_layer\.weight", "embed_per_layer.weight"),
    (r"per_layer_model_projection\.weight", "per_layer_projection.weight"),
    (r"per_layer_projection_norm\.weight", "per_layer_norm.weight"),
    NORM1_RULE,
    (_LL + r"post_attention_layernorm\.weight", _B + r"post_attn_norm.weight"),
    (_LL + r"pre_feedforward_layernorm\.weight", _B + r"norm2.weight"),
    (_LL + r"post_feedforward_layernorm\.weight", _B + r"post_mlp_norm.weight"),
    *ATTENTION_RULES,
    (_LL + r"self_attn\.(q|k)_norm\.weight", _B + r"attn.\2_norm.weight"),
    (_LL + r"mlp\.(gate|up|down)_proj\.weight", _B + r"mlp.\2.weight"),
    (_LL + r"per_layer_input_gate\.weight", _B + r"per_layer_gate.weight"),
    (_LL + r"per_layer_projection\.weight", _B + r"per_layer_proj.weight"),
    (_LL + r"post_per_layer_input_norm\.weight", _B + r"per_layer_norm.weight"),
    (_LL + r"layer_scalar", _B + r"layer_scalar"),
    # MoE (enable_moe_block): the router, the experts, and their norms beside the dense MLP's
    (_LL + r"router\.(proj\.weight|scale|per_expert_scale)", _B + r"moe.router.\2"),
    (_LL + r"experts\.gate_up_proj", _B + r"moe.experts.gate_up"),
    (_LL + r"experts\.down_proj", _B + r"moe.experts.down"),
    (_LL + r"pre_feedforward_layernorm_2\.weight", _B + r"moe.norm_in.weight"),
    (_LL + r"post_feedforward_layernorm_2\.weight", _B + r"moe.norm_out.weight"),
    (_LL + r"post_feedforward_layernorm_1\.weight", _B + r"post_dense_norm.weight"),
    *FINAL_RULES,
]
ARCHITECTURES[F] = Architecture(F, "text", Gemma4, _gemma4_config, GEMMA4_RULES, ("model.",),
                                names=_NAMES)
# The multimodal checkpoints (model_type gemma4): the language model only; the vision and audio towers and
# their embedders are left out, so the app shows the text attention of an image/audio-text model.
ARCHITECTURES["gemma4"] = Architecture(
    F, "text", Gemma4, _gemma4_config, GEMMA4_RULES,
    ("model.language_model.", "language_model.model.", "model."),
    ignore=(r"(model\.)?vision_tower\..*", r"(model\.)?embed_vision\..*", r"(model\.)?audio_tower\..*",
            r"(model\.)?embed_audio\..*"), names=_NAMES,
    note="Gemma 4's language model only: the vision and audio towers are not loaded",
)
