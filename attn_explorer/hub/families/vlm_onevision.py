"""LLaVA OneVision (model_type llava_onevision): a SigLIP tower read at vision_feature_layer, LLaVA's 2-layer MLP
projector, a Qwen2 decoder, and "anyres" pictures: a base view at the tower's size, then the picture on the canvas
of tiles (image_grid_pinpoints) that fits it best, laid out as one grid with a learned newline vector after each
row (core.vlm_connectors; the prompt's <image> expanded as LlavaOnevisionProcessor does: hub.vlm_inputs)."""
from __future__ import annotations

import re

from attn_explorer.core.vlm import VLMConfig, VisionLanguage
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import ACTS, ARCHITECTURES, Architecture
from attn_explorer.hub.families.decoders import LLAMA_RULES
from attn_explorer.hub.families.vlm import _HEAD, _IGNORE, _L, _TOWER_RULES, _decoder, _depth, _eos, _tower

# LlavaOnevisionConfig's defaults of its tower (siglip-so400m at 384 px), which a config.json may leave out
_TOWER = dict(hidden_size=1152, intermediate_size=4304, patch_size=14, image_size=384, num_hidden_layers=26,
              num_attention_heads=16)
_PINPOINTS = [[384 * r, 384 * c] for r in range(1, 7) for c in range(1, 7)]


def _onevision_config(cfg: dict) -> VLMConfig:
    family = "llava_onevision"
    vision, mt = _tower(cfg, family, "siglip_vision_model", _TOWER)
    if mt != "siglip_vision_model":  # a class token would not lay out as the square grid of each view
        raise UserError(f"{family}: vision_config.model_type must be 'siglip_vision_model', got {mt!r}")
    text = _decoder(cfg, family, "qwen2")
    if not cfg.get("tie_word_embeddings") and (cfg.get("text_config") or {}).get("tie_word_embeddings"):
        text.tie_embeddings = True  # LlavaOnevisionConfig takes the text model's tie when its own is off
    strategy = cfg.get("vision_feature_select_strategy", "full")
    if strategy != "full":
        raise UserError(f"{family}: vision_feature_select_strategy must be 'full' (with 'default' transformers' "
                        f"processor and model count different image tokens), got {strategy!r}")
    proj_act = cfg.get("projector_hidden_act", "gelu")
    if proj_act not in ACTS:
        raise UserError(f"{family}: projector_hidden_act {proj_act!r} is not supported (supported: {', '.join(ACTS)})")
    side = vision.image_size
    pins = cfg.get("image_grid_pinpoints") or _PINPOINTS
    if not isinstance(pins, list) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 and v > 0 and v % side == 0 for v in p) for p in pins):
        raise UserError(f"{family}: image_grid_pinpoints must be [height, width] pairs in whole multiples of the "
                        f"tower's image_size ({side} px), got {pins!r}"[:300])
    ratio = cfg.get("vision_aspect_ratio", "anyres_max_9")
    found = re.fullmatch(r"anyres_max_([1-9]\d*)", ratio) if isinstance(ratio, str) else None
    if not found:
        raise UserError(f"{family}: vision_aspect_ratio must be 'anyres_max_N' (N a whole number >= 1), got {ratio!r}")
    return VLMConfig(vision=vision, text=text, kind=family,
                     image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 151646))),
                     feature_depth=_depth(cfg.get("vision_feature_layer", -1), vision.num_layers, family),
                     drop_class_token=False, projector_act=ACTS[proj_act],
                     projector_bias=bool(cfg.get("multimodal_projector_bias", True)),
                     grid_pinpoints=[list(p) for p in pins], max_tiles=int(found.group(1)),
                     text_bos=None, text_eos=_eos(cfg, 151645))


ARCHITECTURES["llava_onevision"] = Architecture(
    "llava_onevision", "image-text", VisionLanguage, _onevision_config,
    _TOWER_RULES + [(_L + p, "language." + r) for p, r in LLAMA_RULES] + _HEAD
    + [(r"(?:model\.)?multi_modal_projector\.linear_(1|2)\.(weight|bias)", r"projector.linear_\1.\2"),
       (r"(?:model\.)?image_newline", "image_newline")],
    ignore=_IGNORE,
    note="image and text: a base view, then the picture in tiles laid out as one grid with a newline after each row",
)
