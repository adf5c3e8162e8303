"""Vision-language rows: LLaVA 1.5 (CLIP or SigLIP tower, 2-layer MLP projector, a Llama / Qwen2 / ... decoder)
and PaliGemma (SigLIP tower, linear projector, Gemma decoder with its prompt open both ways), on core.vlm.
The tower and the decoder read their sub-configs through the rows of their own families, so every
check those rows make (RoPE, windows, activations) applies here too."""
from __future__ import annotations

import dataclasses

from attn_explorer.core.llama import LlamaConfig
from attn_explorer.core.qwen3_vision import QWEN3_VISION_RULES, Qwen3VisionConfig
from attn_explorer.core.qwen_vision import QWEN_VISION_RULES, QwenVisionConfig
from attn_explorer.core.vlm import VLMConfig, VisionLanguage
from attn_explorer.errors import UserError
from attn_explorer.hub.families.clip import (CLIP_VISION_DEFAULTS, CLIP_VISION_RULES, SIGLIP_VISION_DEFAULTS,
                                             _clip_vision_config, _siglip_vision_config)
from attn_explorer.hub.families.common import (ARCHITECTURES, ACTS, Architecture, act, check_config,
                                              norm_eps, rope, rope_entry, rope_kind)
from attn_explorer.hub.families.decoders import LLAMA_RULES, QWEN3_RULES

_TOWERS = {"clip_vision_model": (_clip_vision_config, CLIP_VISION_DEFAULTS),
           "siglip_vision_model": (_siglip_vision_config, SIGLIP_VISION_DEFAULTS),
           "idefics3_vision": (_siglip_vision_config, SIGLIP_VISION_DEFAULTS),
           "smolvlm_vision": (_siglip_vision_config, SIGLIP_VISION_DEFAULTS)}  # SigLIP's tower by another name
# Idefics3VisionConfig's defaults (SmolVLM's ship most of them), which save_pretrained may leave out
_IDEFICS3_TOWER = dict(hidden_size=1152, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=16,
                       image_size=224, patch_size=32, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)



def _sub(cfg: dict, key: str, family: str, default_type: str) -> dict:
    sub = cfg.get(key)
    if sub is None:
        sub = {}
    if not isinstance(sub, dict):
        raise UserError(f"{family}: config.json's {key} must be an object")
    return {"model_type": default_type, **sub}


def _tower(cfg: dict, family: str, default_type: str, defaults: dict | None = None):
    v = _sub(cfg, "vision_config", family, default_type)
    mt = v["model_type"]
    if mt not in _TOWERS:
        raise UserError(f"{family}: vision_config.model_type {mt!r} is not supported (clip_vision_model, "
                        "siglip_vision_model)")
    make, base = _TOWERS[mt]
    return check_config(make({**base, **(defaults or {}), **v}), f"{family} vision_config"), mt


def _gemma1_config(t: dict) -> LlamaConfig:
    """Gemma (1): Llama's decoder with (1 + w) RMSNorms, GeGLU, embeddings times sqrt(width), head_dim 256."""
    heads = t["num_attention_heads"]
    head_dim = t.get("head_dim", 256)
    theta, fraction, scaling = rope(t, "gemma", head_dim, theta=10000.0)
    if fraction != 1.0:
        raise UserError("gemma with partial_rotary_factor is not supported")
    return LlamaConfig(
        vocab_size=t["vocab_size"], dim=t["hidden_size"], num_layers=t["num_hidden_layers"], num_heads=heads,
        num_kv_heads=t.get("num_key_value_heads") or heads, mlp_hidden=t["intermediate_size"],
        max_positions=t.get("max_position_embeddings", 8192), eps=norm_eps(t, "rms_norm_eps", 1e-6),
        rope_theta=theta, rope_scaling=scaling, tie_embeddings=True, head_size=head_dim,
        attention_bias=bool(t.get("attention_bias", False)), norm="rms1p",
        act=act({"hidden_act": t.get("hidden_activation") or t.get("hidden_act") or "gelu_pytorch_tanh"}),
        scale_embeddings=True,
    )


# transformers' defaults of the decoders' sizes, which the hub's image-text checkpoints leave out of text_config
# where they equal them (llava-1.5-7b's text_config names only its vocabulary, positions and epsilon);
# PaliGemma's are its own sub-config defaults
_LLAMA_SIZES = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                    vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-6, hidden_act="silu")
_TEXT_DEFAULTS = {
    "llama": _LLAMA_SIZES,
    "qwen2": dict(_LLAMA_SIZES, intermediate_size=22016, vocab_size=151936, max_position_embeddings=32768),
    "mistral": dict(_LLAMA_SIZES, intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=131072,
                    head_dim=128),
    "gemma": dict(hidden_size=2048, intermediate_size=16384, num_hidden_layers=18, num_attention_heads=8,
                  num_key_value_heads=1, vocab_size=257152, max_position_embeddings=8192),
}


def _decoder(cfg: dict, family: str, default_type: str) -> LlamaConfig:
    t = _sub(cfg, "text_config", family, default_type)
    mt = t["model_type"]
    t = {**_TEXT_DEFAULTS.get(mt, {}), **{k: v for k, v in t.items() if v is not None}}
    if mt == "gemma":
        text = _gemma1_config(t)
    elif mt in ("llama", "qwen2", "mistral") and family in ("llava", "idefics3", "llava_onevision"):
        text = ARCHITECTURES[mt].make_config(t)
    else:
        raise UserError(f"{family}: text_config.model_type {mt!r} is not supported yet "
                        f"({'gemma' if family == 'paligemma' else 'llama, qwen2, mistral'})")
    if "tie_word_embeddings" in cfg:  # the whole model's flag ties its LM head
        text.tie_embeddings = bool(cfg["tie_word_embeddings"])
    return check_config(text, f"{family} text_config")


def _special(cfg: dict, key: str, default: int):
    v = cfg.get(key, (cfg.get("text_config") or {}).get(key, default))
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _eos(cfg: dict, default: int):
    """The end token(s) generation stops at: one id, or a tuple of ids where the checkpoint lists several
    (gemma-3-4b-it: `"eos_token_id": [1, 106]`, <eos> and <end_of_turn>); None: none readable."""
    v = cfg.get("eos_token_id", (cfg.get("text_config") or {}).get("eos_token_id", default))
    if isinstance(v, list):
        ids = tuple(i for i in v if isinstance(i, int) and not isinstance(i, bool))
        return ids if ids else None
    return _special({"eos_token_id": v}, "eos_token_id", default)


def _depth(layer, layers: int, family: str) -> int:
    """LLaVA's vision_feature_layer (an index into the tower's hidden states: 0 = the embeddings, -1 = the
    last block's output) as a count of blocks run."""
    if isinstance(layer, list):
        raise UserError(f"{family}: a list of vision_feature_layer (several layers concatenated) is not supported yet")
    if isinstance(layer, bool) or not isinstance(layer, int) or not -(layers + 1) <= layer <= layers:
        raise UserError(f"{family}: vision_feature_layer must be a whole number from {-(layers + 1)} to {layers}, "
                        f"got {layer!r}")
    return layer if layer >= 0 else layers + 1 + layer


def _llava_config(cfg: dict) -> VLMConfig:
    vision, _ = _tower(cfg, "llava", "clip_vision_model")
    strategy = cfg.get("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise UserError(f"llava: vision_feature_select_strategy must be 'default' or 'full', got {strategy!r}")
    proj_act = cfg.get("projector_hidden_act", "gelu")
    if proj_act not in ACTS:
        raise UserError(f"llava: projector_hidden_act {proj_act!r} is not supported (supported: {', '.join(ACTS)})")
    return VLMConfig(vision=vision, text=_decoder(cfg, "llava", "llama"), kind="llava",
                     image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 32000))),
                     feature_depth=_depth(cfg.get("vision_feature_layer", -2), vision.num_layers, "llava"),
                     drop_class_token=strategy == "default" and vision.class_token,
                     projector_act=ACTS[proj_act], projector_bias=bool(cfg.get("multimodal_projector_bias", True)),
                     text_bos=_special(cfg, "bos_token_id", 1), text_eos=_eos(cfg, 2))


_PALIGEMMA_TOWER = dict(intermediate_size=4096, hidden_size=1152, patch_size=14, image_size=224, num_hidden_layers=27,
                        num_attention_heads=16)


def _paligemma_config(cfg: dict) -> VLMConfig:
    vision, _ = _tower(cfg, "paligemma", "siglip_vision_model", _PALIGEMMA_TOWER)
    text = _decoder(cfg, "paligemma", "gemma")
    proj = cfg.get("projection_dim", 2048)
    if proj != text.dim:
        raise UserError(f"paligemma: projection_dim {proj!r} differs from text_config.hidden_size {text.dim}")
    return VLMConfig(vision=vision, text=text, kind="paligemma",
                     image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 256000))),
                     feature_depth=vision.num_layers, drop_class_token=False, prefix_lm=True,
                     text_bos=_special(cfg, "bos_token_id", 2), text_eos=_eos(cfg, 1))


def _idefics3_config(cfg: dict) -> VLMConfig:
    family = "smolvlm" if cfg.get("model_type") == "smolvlm" else "idefics3"
    vision, _ = _tower(cfg, family, f"{family}_vision", _IDEFICS3_TOWER)
    s = cfg.get("scale_factor", 2)
    if isinstance(s, bool) or not isinstance(s, int) or s < 1 or vision.native_grid % s:
        raise UserError(f"idefics3: scale_factor must be a whole number >= 1 that divides the tower's patch grid "
                        f"({vision.native_grid}), got {s!r}")
    return VLMConfig(vision=vision, text=_decoder(cfg, "idefics3", "llama"), kind="idefics3",
                     image_token_id=int(cfg.get("image_token_id", 128257)), feature_depth=vision.num_layers,
                     drop_class_token=False, scale_factor=s, text_bos=_special(cfg, "bos_token_id", 1),
                     text_eos=_eos(cfg, 2))


_T, _L = r"(?:model\.)?vision_tower\.(?:vision_model\.)?", r"(?:model\.)?language_model\.(?:model\.)?"
_TOWER_RULES = [(_T + p, "vision." + r) for p, r in CLIP_VISION_RULES]
_DECODER_RULES = [(_L + p, "language." + r) for p, r in LLAMA_RULES]
_HEAD = [(r"(?:model\.)?(?:language_model\.)?lm_head\.weight", "language.lm_head.weight")]
_IGNORE = (_T + r"embeddings\.position_ids", _T + r"head\..*", _L + r"rotary_emb\.inv_freq")

ARCHITECTURES["llava"] = Architecture(
    "llava", "image-text", VisionLanguage, _llava_config,
    _TOWER_RULES + _DECODER_RULES + _HEAD
    + [(r"(?:model\.)?multi_modal_projector\.linear_(1|2)\.(weight|bias)", r"projector.linear_\1.\2")],
    ignore=_IGNORE, note="image and text: the decoder's maps over every token; the tower's maps beside them",
)
ARCHITECTURES["paligemma"] = Architecture(
    "paligemma", "image-text", VisionLanguage, _paligemma_config,
    _TOWER_RULES + _DECODER_RULES + _HEAD
    + [(r"(?:model\.)?multi_modal_projector\.linear\.(weight|bias)", r"projector.linear.\1")],
    ignore=_IGNORE, note="image and text: the image and the prompt attend to each other both ways (a prefix)",
)

_IT, _IL = r"(?:model\.)?vision_model\.", r"(?:model\.)?text_model\.(?:model\.)?"
ARCHITECTURES["idefics3"] = Architecture(
    "idefics3", "image-text", VisionLanguage, _idefics3_config,
    [(_IT + p, "vision." + r) for p, r in CLIP_VISION_RULES] + [(_IL + p, "language." + r) for p, r in LLAMA_RULES]
    + _HEAD + [(r"(?:model\.)?connector\.modality_projection\.proj\.weight", "projector.proj.weight")],
    ignore=(_IT + r"embeddings\.position_ids", _IL + r"rotary_emb\.inv_freq"),
    note="image and text: a picture larger than one tile is read as tiles and a global view (SmolVLM, Idefics3)",
)
ARCHITECTURES["smolvlm"] = dataclasses.replace(ARCHITECTURES["idefics3"], family="smolvlm")


# Qwen2.5-VL: its own tower (core.qwen_vision), a Qwen2 decoder with M-RoPE. The hub's checkpoints write the
# decoder's fields at the top level with rope_scaling {"type": "mrope", "mrope_section": [...]}; transformers 5
# saves them under text_config with rope_parameters. Both are read.
_QWEN_TOWER = dict(depth=32, hidden_size=3584, hidden_act="silu", intermediate_size=3420, num_heads=16, in_channels=3,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112, out_hidden_size=3584,
                   fullatt_block_indexes=[7, 15, 23, 31])


def _qwen_tower(v: dict) -> QwenVisionConfig:
    v = {**_QWEN_TOWER, **{k: x for k, x in v.items() if x is not None}}
    theta = (v.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    full = v["fullatt_block_indexes"]
    if not isinstance(full, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in full):
        raise UserError(f"qwen2_5_vl: vision_config.fullatt_block_indexes must be a list of block numbers, "
                        f"got {full!r}")
    a = v["hidden_act"]
    if a not in ACTS:
        raise UserError(f"qwen2_5_vl: vision_config.hidden_act {a!r} is not supported (supported: {', '.join(ACTS)})")
    cfg = QwenVisionConfig(dim=v["hidden_size"], num_layers=v["depth"], num_heads=v["num_heads"],
                           mlp_hidden=v["intermediate_size"], out_dim=v["out_hidden_size"], patch_size=v["patch_size"],
                           temporal_patch_size=v["temporal_patch_size"], merge=v["spatial_merge_size"],
                           window_size=v["window_size"], full_layers=list(full), in_channels=v["in_channels"],
                           rope_theta=float(theta), act=ACTS[a])
    check_config(cfg, "qwen2_5_vl vision_config")
    if cfg.dim % cfg.num_heads or cfg.head_dim % 4 or cfg.window_tokens < 1:
        raise UserError("qwen2_5_vl: vision_config needs hidden_size / num_heads divisible by 4 and window_size >= "
                        "patch_size × spatial_merge_size")
    return cfg


def _qwen2_5_vl_config(cfg: dict) -> VLMConfig:
    t = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    if not (t and "hidden_size" in t):  # the hub's form: the decoder's fields at the top level
        t = {k: v for k, v in cfg.items() if k not in ("vision_config", "text_config")}
    t = dict(t)
    p, _ = rope_entry(t, "qwen2_5_vl")
    section = p.get("mrope_section", [16, 24, 24])
    kind = rope_kind(p)
    if kind not in ("default", "mrope"):
        raise UserError(f"qwen2_5_vl: rope type {kind!r} is not supported with M-RoPE (default / mrope)")
    theta = p.get("rope_theta", t.get("rope_theta", 1000000.0))
    plain = {k: v for k, v in t.items() if k not in ("rope_scaling", "rope_parameters", "model_type")}
    plain["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    text = ARCHITECTURES["qwen2"].make_config(plain)
    if "tie_word_embeddings" in cfg:
        text.tie_embeddings = bool(cfg["tie_word_embeddings"])
    check_config(text, "qwen2_5_vl text_config")
    if (not isinstance(section, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                 for s in section) or sum(section) != text.head_dim // 2):
        raise UserError(f"qwen2_5_vl: mrope_section must be whole numbers summing to head_dim / 2 "
                        f"({text.head_dim // 2}), got {section!r}")
    v = cfg.get("vision_config") or {}
    if not isinstance(v, dict):
        raise UserError("qwen2_5_vl: config.json's vision_config must be an object")
    vision = _qwen_tower(v)
    if vision.out_dim != text.dim:
        raise UserError(f"qwen2_5_vl: vision_config.out_hidden_size {vision.out_dim} differs from the decoder's "
                        f"hidden_size {text.dim}")
    return VLMConfig(vision=vision, text=text, kind="qwen2_5_vl", image_token_id=int(cfg.get("image_token_id", 151655)),
                     drop_class_token=False, mrope_section=list(section), text_bos=None,
                     text_eos=_eos(cfg, 151645))


_QV, _QL = r"(?:model\.)?visual\.", r"(?:model\.language_model\.|model\.)"
ARCHITECTURES["qwen2_5_vl"] = Architecture(
    "qwen2_5_vl", "image-text", VisionLanguage, _qwen2_5_vl_config,
    [(_QV + p, "vision." + r) for p, r in QWEN_VISION_RULES] + [(_QL + p, "language." + r) for p, r in LLAMA_RULES]
    + [(r"lm_head\.weight", "language.lm_head.weight")],
    ignore=(_QL + r"rotary_emb\.inv_freq", _QV + r"rotary_pos_emb\.inv_freq"),
    note="image and text: the picture at its own resolution (multiples of 28 px), windowed tower blocks, M-RoPE",
)


# Qwen3-VL: its own tower (core.qwen3_vision: learned positions, DeepStack mergers), a Qwen3 decoder (q/k norms)
# with interleaved M-RoPE, the DeepStack vectors added after its first layers (core.vlm)
_QWEN3_TOWER = dict(depth=27, hidden_size=1152, hidden_act="gelu_pytorch_tanh", intermediate_size=4304, num_heads=16,
                    in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584,
                    num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24])


def _qwen3_tower(v: dict) -> Qwen3VisionConfig:
    v = {**_QWEN3_TOWER, **{k: x for k, x in v.items() if x is not None}}
    deep = v["deepstack_visual_indexes"]
    if not isinstance(deep, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < v["depth"]
                                             for i in deep):
        raise UserError(f"qwen3_vl: vision_config.deepstack_visual_indexes must be block numbers below depth, got {deep!r}")
    a = v["hidden_act"]
    if a not in ACTS:
        raise UserError(f"qwen3_vl: vision_config.hidden_act {a!r} is not supported (supported: {', '.join(ACTS)})")
    side = int(v["num_position_embeddings"] ** 0.5) if isinstance(v["num_position_embeddings"], int) else 0
    if side < 1 or side * side != v["num_position_embeddings"]:
        raise UserError("qwen3_vl: vision_config.num_position_embeddings must be a square number, got "
                        f"{v['num_position_embeddings']!r}")
    theta = (v.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    cfg = Qwen3VisionConfig(dim=v["hidden_size"], num_layers=v["depth"], num_heads=v["num_heads"],
                            mlp_hidden=v["intermediate_size"], out_dim=v["out_hidden_size"], patch_size=v["patch_size"],
                            temporal_patch_size=v["temporal_patch_size"], merge=v["spatial_merge_size"],
                            num_positions=v["num_position_embeddings"], deepstack=list(deep),
                            in_channels=v["in_channels"], rope_theta=float(theta), act=ACTS[a])
    check_config(cfg, "qwen3_vl vision_config")
    if cfg.head_dim % 4:
        raise UserError("qwen3_vl: vision_config needs hidden_size / num_heads divisible by 4")
    return cfg


def _qwen3_vl_config(cfg: dict) -> VLMConfig:
    t = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    p, _ = rope_entry(t, "qwen3_vl")
    section = p.get("mrope_section", [24, 20, 20])
    kind = rope_kind(p)
    if kind not in ("default", "mrope"):
        raise UserError(f"qwen3_vl: rope type {kind!r} is not supported with M-RoPE (default / mrope)")
    theta = p.get("rope_theta", t.get("rope_theta", 5000000.0))
    plain = {k: v for k, v in t.items() if k not in ("rope_scaling", "rope_parameters", "model_type")}
    plain["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    text = ARCHITECTURES["qwen3"].make_config(plain)
    if "tie_word_embeddings" in cfg:
        text.tie_embeddings = bool(cfg["tie_word_embeddings"])
    check_config(text, "qwen3_vl text_config")
    if (not isinstance(section, list) or len(section) != 3 or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)
            or sum(section) != text.head_dim // 2):
        raise UserError(f"qwen3_vl: mrope_section must be 3 whole numbers summing to head_dim / 2 "
                        f"({text.head_dim // 2}), got {section!r}")
    v = cfg.get("vision_config") or {}
    if not isinstance(v, dict):
        raise UserError("qwen3_vl: config.json's vision_config must be an object")
    vision = _qwen3_tower(v)
    if vision.out_dim != text.dim:
        raise UserError(f"qwen3_vl: vision_config.out_hidden_size {vision.out_dim} differs from the decoder's "
                        f"hidden_size {text.dim}")
    if len(vision.deepstack) > text.num_layers:
        raise UserError("qwen3_vl: more deepstack_visual_indexes than decoder layers")
    return VLMConfig(vision=vision, text=text, kind="qwen3_vl", image_token_id=int(cfg.get("image_token_id", 151655)),
                     drop_class_token=False, mrope_section=list(section), mrope_interleaved=True, text_bos=None,
                     text_eos=_eos(cfg, 151645))


ARCHITECTURES["qwen3_vl"] = Architecture(
    "qwen3_vl", "image-text", VisionLanguage, _qwen3_vl_config,
    [(_QV + p, "vision." + r) for p, r in QWEN3_VISION_RULES] + [(_QL + p, "language." + r) for p, r in QWEN3_RULES]
    + [(r"lm_head\.weight", "language.lm_head.weight")],
    ignore=(_QL + r"rotary_emb\.inv_freq",),
    note="image and text: the picture at its own resolution, DeepStack tower features added after the first layers",
)
