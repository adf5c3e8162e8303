"""Vision transformers: ViT, DeiT (distillation token, two heads), DINOv2 (LayerScale, mask token).
`vit_config` is the reader the CLIP and SigLIP towers share."""
from __future__ import annotations

from attn_explorer.core.vit import ViTConfig, VisionTransformer
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import ARCHITECTURES, B as _B, Architecture, act, norm_eps

def _classifier_labels(cfg: dict) -> int:
    archs = " ".join(cfg.get("architectures") or [])
    return len(cfg.get("id2label") or {}) if "ForImageClassification" in archs else 0


def vit_config(cfg: dict, **extra) -> ViTConfig:
    size = cfg.get("image_size", 224)
    patch = cfg.get("patch_size", 16)
    if isinstance(size, (list, tuple)) or isinstance(patch, (list, tuple)):
        raise UserError("non-square image_size or patch_size in config.json is not supported")
    base = dict(
        image_size=size, patch_size=patch, channels=cfg.get("num_channels", 3), dim=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
        mlp_hidden=cfg.get("intermediate_size") or 4 * cfg["hidden_size"], eps=norm_eps(cfg, "layer_norm_eps", 1e-12),
        act=act(cfg), qkv_bias=cfg.get("qkv_bias", True),
    )
    base.update(extra)
    return ViTConfig(**base)


def _deit_config(cfg: dict) -> ViTConfig:
    archs = " ".join(cfg.get("architectures") or [])
    return vit_config(cfg, distillation_token=True, num_labels=_classifier_labels(cfg),
                       classifier_tokens=2 if "WithTeacher" in archs else 1)


def _dinov2_config(cfg: dict) -> ViTConfig:
    if cfg.get("use_swiglu_ffn"):
        raise UserError("DINOv2 with a SwiGLU MLP (the giant model) is not supported yet")
    return vit_config(
        cfg, eps=norm_eps(cfg, "layer_norm_eps", 1e-6), mlp_hidden=int(cfg["hidden_size"] * cfg.get("mlp_ratio", 4)),
        layerscale=cfg.get("layerscale_value", 1.0), mask_token=True,
    )


_V = r"encoder\.layer\.(\d+)\."
VISION_COMMON = [
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.mask_token", "mask_token"),
    (r"embeddings\.position_embeddings", "pos_embed"),
    (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (_V + r"attention\.attention\.(query|key|value)\.(weight|bias)", _B + r"attn.\2.\3"),
    (_V + r"attention\.output\.dense\.(weight|bias)", _B + r"attn.out.\2"),
    (r"layernorm\.(weight|bias)", r"norm.\1"),
    (r"pooler\.dense\.(weight|bias)", r"pooler.\1"),
]
VIT_BLOCK = [
    (_V + r"layernorm_before\.(weight|bias)", _B + r"norm1.\2"),
    (_V + r"layernorm_after\.(weight|bias)", _B + r"norm2.\2"),
    (_V + r"intermediate\.dense\.(weight|bias)", _B + r"mlp.fc1.\2"),
    (_V + r"output\.dense\.(weight|bias)", _B + r"mlp.fc2.\2"),
]
DINOV2_BLOCK = [
    (_V + r"norm(1|2)\.(weight|bias)", _B + r"norm\2.\3"),
    (_V + r"mlp\.(fc1|fc2)\.(weight|bias)", _B + r"mlp.\2.\3"),
    (_V + r"layer_scale(1|2)\.lambda1", _B + r"ls\2.lambda1"),
]


ARCHITECTURES.update({
    "vit": Architecture(
        "vit", "image", VisionTransformer, lambda c: vit_config(c, num_labels=_classifier_labels(c)),
        VISION_COMMON + VIT_BLOCK + [(r"classifier\.(weight|bias)", r"heads.0.\1")], ("vit.",),
    ),
    "deit": Architecture(
        "deit", "image", VisionTransformer, _deit_config,
        VISION_COMMON + VIT_BLOCK + [
            (r"embeddings\.distillation_token", "dist_token"),
            (r"(?:cls_)?classifier\.(weight|bias)", r"heads.0.\1"),
            (r"distillation_classifier\.(weight|bias)", r"heads.1.\1"),
        ],
        ("deit.",),
    ),
    "dinov2": Architecture(
        "dinov2", "image", VisionTransformer, _dinov2_config, VISION_COMMON + DINOV2_BLOCK, ("dinov2.",),
        ignore=(r"classifier\..*",),
    ),
})
