"""Gemma 3's image-text checkpoints (model_type gemma3, Gemma3ForConditionalGeneration) as vision-language
models: a SigLIP tower, the soft-embedding projector (pooled, normed, projected: core.vlm_connectors) and the
Gemma 3 decoder read by the gemma row's own reader, each run of image tokens attending to itself both ways.

A gemma3 config.json with no vision tower (vision_config absent, null or empty) still loads its language model
through the text row (families.gemma), as before."""
from __future__ import annotations

import dataclasses
import math

from attn_explorer.core.vlm import VLMConfig, VisionLanguage
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import ARCHITECTURES, Architecture
from attn_explorer.hub.families.gemma import GEMMA_RULES, _gemma_config
from attn_explorer.hub.families.vlm import _HEAD, _IGNORE, _L, _TOWER_RULES, _eos, _special, _tower


def _whole(cfg: dict, key: str, default: int) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise UserError(f"gemma3: {key} must be a whole number >= 0, got {v!r}")
    return v


def _gemma3_vlm_config(cfg: dict) -> VLMConfig:
    vision, mt = _tower(cfg, "gemma3", "siglip_vision_model")
    if mt != "siglip_vision_model":  # a class token would not pool into the square grid the projector reads
        raise UserError(f"gemma3: vision_config.model_type must be 'siglip_vision_model', got {mt!r}")
    text = _gemma_config(cfg)  # text_config, as Gemma3ForConditionalGeneration reads it (no final soft-cap)
    if "tie_word_embeddings" in cfg:
        text.tie_embeddings = bool(cfg["tie_word_embeddings"])
    n = cfg.get("mm_tokens_per_image", 256)
    side = math.isqrt(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
    patches = vision.native_grid
    if side < 1 or side * side != n or patches % side:
        raise UserError(f"gemma3: mm_tokens_per_image must be a square number whose side divides the tower's patch "
                        f"grid ({patches} × {patches}), got {n!r}")
    windows = {w for w in text.sliding_windows or [] if w}
    if len(windows) > 1:
        raise UserError("gemma3: local layers with different sliding windows are not supported with images")
    image_id = _whole(cfg, "image_token_index", _whole(cfg, "image_token_id", 262144))
    eps = (cfg.get("vision_config") or {}).get("layer_norm_eps", 1e-6)
    return VLMConfig(vision=vision, text=text, kind="gemma3", image_token_id=image_id,
                     feature_depth=vision.num_layers, drop_class_token=False, pool=patches // side, soft_emb_eps=eps,
                     text_bos=_special(cfg, "bos_token_id", 2), text_eos=_eos(cfg, 1),
                     boi_token_id=_whole(cfg, "boi_token_index", 255999),
                     eoi_token_id=_whole(cfg, "eoi_token_index", 256000))


_P = r"(?:model\.)?multi_modal_projector\."
GEMMA3_VLM = Architecture(
    "gemma3", "image-text", VisionLanguage, _gemma3_vlm_config,
    _TOWER_RULES + [(_L + p, "language." + r) for p, r in GEMMA_RULES] + _HEAD
    + [(_P + r"(mm_input_projection_weight|mm_soft_emb_norm\.weight)", r"projector.\1")],
    ignore=_IGNORE,
    note="image and text: each run of image tokens attends to itself both ways (the local layers keep their window)",
)
_TEXT_ROW = ARCHITECTURES["gemma3"]


def _pick(cfg: dict) -> Architecture:
    """The vision-language row where config.json describes a vision tower, else the language model's row."""
    return GEMMA3_VLM if cfg.get("vision_config") not in (None, {}) else _TEXT_ROW


ARCHITECTURES["gemma3"] = dataclasses.replace(_TEXT_ROW, variant=_pick)
