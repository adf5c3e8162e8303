"""CLIP and SigLIP towers: q/k/v/out_proj attention in layer_norm1/2 pre-LN blocks. The vision tower
reads into our ViT, CLIP's text tower into its own causal transformer; a whole CLIP/SigLIP folder
loads one tower and leaves the other and the contrastive head out."""
from __future__ import annotations

from attn_explorer.core.clip_text import ClipTextConfig, ClipTextTransformer
from attn_explorer.core.vit import ViTConfig, VisionTransformer
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import ARCHITECTURES, B as _B, Architecture, act
from attn_explorer.hub.families.vision import vit_config

CLIP_VISION_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                            image_size=224, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5)
SIGLIP_VISION_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                              image_size=224, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
CLIP_TEXT_DEFAULTS = dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                          num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5)


def _tower(cfg: dict, key: str, defaults: dict) -> dict:
    """The tower's own config (a whole CLIP/SigLIP folder nests it under key), over the family's defaults:
    save_pretrained leaves out fields equal to the defaults."""
    sub = cfg.get(key) if cfg.get("model_type") in ("clip", "siglip") else cfg
    if not isinstance(sub, dict):
        raise UserError(f"config.json has no {key} object for the {cfg.get('model_type')} model's tower")
    return {**defaults, **{k: v for k, v in sub.items() if v is not None}}


def _clip_vision_config(cfg: dict) -> ViTConfig:
    c = _tower(cfg, "vision_config", CLIP_VISION_DEFAULTS)
    return vit_config(c, eps=c["layer_norm_eps"], qkv_bias=True, patch_bias=False, pre_norm=True, norm_output=False,
                       flat_tables=True)


def _siglip_vision_config(cfg: dict) -> ViTConfig:
    c = _tower(cfg, "vision_config", SIGLIP_VISION_DEFAULTS)
    return vit_config(c, eps=c["layer_norm_eps"], qkv_bias=True, class_token=False, flat_tables=True)


def _clip_text_config(cfg: dict) -> ClipTextConfig:
    c = _tower(cfg, "text_config", CLIP_TEXT_DEFAULTS)
    return ClipTextConfig(
        vocab_size=c["vocab_size"], dim=c["hidden_size"], num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"], mlp_hidden=c["intermediate_size"],
        max_positions=c["max_position_embeddings"], eps=c["layer_norm_eps"], act=act(c),
    )


_CL = r"encoder\.layers\.(\d+)\."
CLIP_BLOCK = [
    (_CL + r"layer_norm(1|2)\.(weight|bias)", _B + r"norm\2.\3"),
    (_CL + r"self_attn\.q_proj\.(weight|bias)", _B + r"attn.query.\2"),
    (_CL + r"self_attn\.k_proj\.(weight|bias)", _B + r"attn.key.\2"),
    (_CL + r"self_attn\.v_proj\.(weight|bias)", _B + r"attn.value.\2"),
    (_CL + r"self_attn\.out_proj\.(weight|bias)", _B + r"attn.out.\2"),
    (_CL + r"mlp\.(fc1|fc2)\.(weight|bias)", _B + r"mlp.\2.\3"),
]
CLIP_VISION_RULES = CLIP_BLOCK + [
    (r"embeddings\.class_embedding", "cls_token"),
    (r"embeddings\.patch_embedding\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"embeddings\.position_embedding\.weight", "pos_embed"),
    (r"pre_layrnorm\.(weight|bias)", r"pre_norm.\1"),
    (r"post_layernorm\.(weight|bias)", r"norm.\1"),
]
CLIP_TEXT_RULES = CLIP_BLOCK + [
    (r"embeddings\.token_embedding\.weight", "token_embedding.weight"),
    (r"embeddings\.position_embedding\.weight", "position_embedding.weight"),
    (r"final_layer_norm\.(weight|bias)", r"final_layer_norm.\1"),
]
# A whole CLIP/SigLIP folder: the other tower and the contrastive head are left out.
CLIP_PAIR_HEADS = (r"logit_scale", r"logit_bias", r"text_projection\..*", r"visual_projection\..*")
VISION_IGNORE = (r"embeddings\.position_ids", r"head\..*", r"text_model\..*") + CLIP_PAIR_HEADS  # head: SigLIP's pooling
TEXT_IGNORE = (r"embeddings\.position_ids", r"head\..*", r"vision_model\..*") + CLIP_PAIR_HEADS  # head: SigLIP's projection

for _mt, _family, _make in (("clip_vision_model", "clip", _clip_vision_config), ("clip", "clip", _clip_vision_config),
                            ("siglip_vision_model", "siglip", _siglip_vision_config),
                            ("siglip", "siglip", _siglip_vision_config)):
    ARCHITECTURES[_mt] = Architecture(_family, "image", VisionTransformer, _make, CLIP_VISION_RULES,
                                      ("vision_model.",), VISION_IGNORE)
ARCHITECTURES["clip_text_model"] = Architecture("clip_text", "text", ClipTextTransformer, _clip_text_config,
                                                CLIP_TEXT_RULES, ("text_model.",), TEXT_IGNORE)
