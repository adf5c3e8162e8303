"""One row per architecture: how an HF config becomes our config, and how HF tensor names map to ours.

Adding a family means adding a row: a config translator, a name map (regex -> our name, with an
optional transform), the task-head prefixes to strip, and the keys we knowingly leave out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from attn_explorer.core.encoder import EncoderConfig, TextEncoder
from attn_explorer.core.gpt2 import GPT2, GPT2Config
from attn_explorer.core.vit import ViTConfig, VisionTransformer
from attn_explorer.errors import UserError
from attn_explorer.core.llama import Llama, LlamaConfig

ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}


def _act(cfg: dict, key: str = "hidden_act") -> str:
    name = cfg.get(key, "gelu")
    if name not in ACTS:
        raise UserError(f"activation {name!r} is not supported (supported: {', '.join(ACTS)})")
    return ACTS[name]


@dataclass(frozen=True)
class Architecture:
    family: str  # our family name
    modality: str  # "text" or "image"
    build: Callable  # our model class: build(our config) -> the nn.Module, its tensors to be filled by map_state_dict
    make_config: Callable[[dict], object]  # HF config.json dict -> our config
    rules: list[tuple[str, str]]  # (HF name regex, our name template); \1 etc. refer to groups
    prefixes: tuple[str, ...] = ()  # task-model prefixes to strip: "bert.", "vit."...
    ignore: tuple[str, ...] = ()  # regexes of HF keys we knowingly do not use (buffers, LM heads)
    transposed: tuple[str, ...] = ()  # regexes of HF keys stored (in, out): GPT-2's Conv1D


# ---- BERT family (BERT, MiniLM, RoBERTa): post-LN encoders -------------------------------------

def _encoder_config(cfg: dict) -> EncoderConfig:
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(f"position_embedding_type {cfg['position_embedding_type']!r} is not supported (only absolute)")
    roberta = cfg.get("model_type") in ("roberta", "xlm-roberta", "camembert")
    return EncoderConfig(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"], mlp_hidden=cfg["intermediate_size"],
        max_positions=cfg["max_position_embeddings"], type_vocab_size=cfg.get("type_vocab_size", 2),
        eps=cfg.get("layer_norm_eps", 1e-12), act=_act(cfg), pad_token_id=cfg.get("pad_token_id") or 0,
        position_offset=(cfg.get("pad_token_id") or 0) + 1 if roberta else 0,
    )


_L = r"encoder\.layer\.(\d+)\."
_B = r"blocks.layers.\1."
ENCODER_RULES = [
    (r"embeddings\.word_embeddings\.(weight)", r"embeddings.word.\1"),
    (r"embeddings\.position_embeddings\.(weight)", r"embeddings.position.\1"),
    (r"embeddings\.token_type_embeddings\.(weight)", r"embeddings.token_type.\1"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"embeddings.norm.\1"),
    (_L + r"attention\.self\.(query|key|value)\.(weight|bias)", _B + r"attn.\2.\3"),
    (_L + r"attention\.output\.dense\.(weight|bias)", _B + r"attn.out.\2"),
    (_L + r"attention\.output\.LayerNorm\.(weight|bias)", _B + r"norm1.\2"),
    (_L + r"intermediate\.dense\.(weight|bias)", _B + r"mlp.fc1.\2"),
    (_L + r"output\.dense\.(weight|bias)", _B + r"mlp.fc2.\2"),
    (_L + r"output\.LayerNorm\.(weight|bias)", _B + r"norm2.\2"),
    (r"pooler\.dense\.(weight|bias)", r"pooler.\1"),
]
TEXT_HEADS = (r"cls\..*", r"lm_head\..*", r"classifier\..*", r"qa_outputs\..*", r"embeddings\.position_ids",
              r"embeddings\.token_type_ids")

# ---- GPT-2: causal, pre-LN, fused QKV in Conv1D (in, out) layout -------------------------------

def _gpt2_config(cfg: dict) -> GPT2Config:
    if cfg.get("scale_attn_by_inverse_layer_idx"):
        raise UserError("GPT-2 with scale_attn_by_inverse_layer_idx is not supported")
    if cfg.get("scale_attn_weights") is False:
        raise UserError("GPT-2 with scale_attn_weights=false is not supported")
    return GPT2Config(
        vocab_size=cfg["vocab_size"], dim=cfg["n_embd"], num_layers=cfg["n_layer"], num_heads=cfg["n_head"],
        mlp_hidden=cfg.get("n_inner") or 4 * cfg["n_embd"], max_positions=cfg["n_positions"],
        eps=cfg.get("layer_norm_epsilon", 1e-5), act=_act(cfg, "activation_function"),
    )


_H = r"h\.(\d+)\."
GPT2_RULES = [
    (r"wte\.weight", "wte.weight"),
    (r"wpe\.weight", "wpe.weight"),
    (_H + r"ln_1\.(weight|bias)", _B + r"norm1.\2"),
    (_H + r"attn\.c_attn\.(weight|bias)", _B + r"attn.qkv.\2"),
    (_H + r"attn\.c_proj\.(weight|bias)", _B + r"attn.out.\2"),
    (_H + r"ln_2\.(weight|bias)", _B + r"norm2.\2"),
    (_H + r"mlp\.c_fc\.(weight|bias)", _B + r"mlp.fc1.\2"),
    (_H + r"mlp\.c_proj\.(weight|bias)", _B + r"mlp.fc2.\2"),
    (r"ln_f\.(weight|bias)", r"ln_f.\1"),
]

# ---- Vision: ViT, DeiT, DINOv2 -----------------------------------------------------------------

def _classifier_labels(cfg: dict) -> int:
    archs = " ".join(cfg.get("architectures") or [])
    return len(cfg.get("id2label") or {}) if "ForImageClassification" in archs else 0


def _vit_config(cfg: dict, **extra) -> ViTConfig:
    size = cfg.get("image_size", 224)
    patch = cfg.get("patch_size", 16)
    if isinstance(size, (list, tuple)) or isinstance(patch, (list, tuple)):
        raise UserError("non-square image_size or patch_size in config.json is not supported")
    base = dict(
        image_size=size, patch_size=patch, channels=cfg.get("num_channels", 3), dim=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
        mlp_hidden=cfg.get("intermediate_size") or 4 * cfg["hidden_size"], eps=cfg.get("layer_norm_eps", 1e-12),
        act=_act(cfg), qkv_bias=cfg.get("qkv_bias", True),
    )
    base.update(extra)
    return ViTConfig(**base)


def _deit_config(cfg: dict) -> ViTConfig:
    archs = " ".join(cfg.get("architectures") or [])
    return _vit_config(cfg, distillation_token=True, num_labels=_classifier_labels(cfg),
                       classifier_tokens=2 if "WithTeacher" in archs else 1)


def _dinov2_config(cfg: dict) -> ViTConfig:
    if cfg.get("use_swiglu_ffn"):
        raise UserError("DINOv2 with a SwiGLU MLP (the giant model) is not supported yet")
    return _vit_config(
        cfg, eps=cfg.get("layer_norm_eps", 1e-6), mlp_hidden=int(cfg["hidden_size"] * cfg.get("mlp_ratio", 4)),
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

ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture("bert", "text", TextEncoder, _encoder_config, ENCODER_RULES, ("bert.",), TEXT_HEADS),
# ---- Llama (SmolLM2): RMSNorm, RoPE, grouped-query attention, SwiGLU ---------------------------

def _llama_config(cfg: dict) -> LlamaConfig:
    if _act(cfg) != "silu":
        raise UserError(f"Llama with hidden_act {cfg.get('hidden_act')!r} is not supported (only silu)")
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default":
        raise UserError(f"Llama with rope_scaling {kind!r} is not supported (only plain RoPE)")
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    if head_dim * heads != cfg["hidden_size"]:
        raise UserError(f"Llama with head_dim {head_dim} × {heads} heads ≠ hidden_size {cfg['hidden_size']} "
                        "is not supported")
    theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    return LlamaConfig(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        mlp_hidden=cfg["intermediate_size"], max_positions=cfg.get("max_position_embeddings", 2048),
        eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=float(theta),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)), mlp_bias=bool(cfg.get("mlp_bias", False)),
    )


_LL = r"layers\.(\d+)\."
LLAMA_RULES = [
    (r"embed_tokens\.weight", "embed_tokens.weight"),
    (_LL + r"input_layernorm\.weight", _B + r"norm1.weight"),
    (_LL + r"self_attn\.q_proj\.(weight|bias)", _B + r"attn.query.\2"),
    (_LL + r"self_attn\.k_proj\.(weight|bias)", _B + r"attn.key.\2"),
    (_LL + r"self_attn\.v_proj\.(weight|bias)", _B + r"attn.value.\2"),
    (_LL + r"self_attn\.o_proj\.(weight|bias)", _B + r"attn.out.\2"),
    (_LL + r"post_attention_layernorm\.weight", _B + r"norm2.weight"),
    (_LL + r"mlp\.(gate|up|down)_proj\.(weight|bias)", _B + r"mlp.\2.\3"),
    (r"norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),  # untied only: a tied model has no place for it
]

    "roberta": Architecture("roberta", "text", TextEncoder, _encoder_config, ENCODER_RULES, ("roberta.",), TEXT_HEADS),
    "gpt2": Architecture(
        "gpt2", "text", GPT2, _gpt2_config, GPT2_RULES, ("transformer.",),
        ignore=(r"h\.\d+\.attn\.(bias|masked_bias)", r"lm_head\..*", r"score\..*"),
        transposed=(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight",),
    ),
    "vit": Architecture(
        "vit", "image", VisionTransformer, lambda c: _vit_config(c, num_labels=_classifier_labels(c)),
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
}
# Same layout, other names.
    "llama": Architecture(
        "llama", "text", Llama, _llama_config, LLAMA_RULES, ("model.",),
        ignore=(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"rotary_emb\.inv_freq"),
    ),
for alias, target in {"xlm-roberta": "roberta", "camembert": "roberta"}.items():
    ARCHITECTURES[alias] = ARCHITECTURES[target]


def supported() -> str:
    return ", ".join(sorted(ARCHITECTURES))


def architecture_for(cfg: dict, where: str) -> Architecture:
    mt = cfg.get("model_type")
    if mt is None:
        raise UserError(f"{where}: config.json has no model_type; supported architectures: {supported()}")
    if mt not in ARCHITECTURES:
        raise UserError(f"{where}: unsupported architecture {mt!r}; supported architectures: {supported()}")
    return ARCHITECTURES[mt]


def map_state_dict(arch: Architecture, hf: dict, ours: dict, where: str) -> dict:
    """HF tensors -> our names, strictly: every HF tensor is used or knowingly ignored, every one of
    our tensors is filled, and every shape agrees. Returns our state dict."""
    rules = [(re.compile(p), r) for p, r in arch.rules]
    ignore = [re.compile(p) for p in arch.ignore]
    transposed = [re.compile(p) for p in arch.transposed]
    out, unknown = {}, []
    for key, tensor in hf.items():
        name = key
        for pre in arch.prefixes:
            if name.startswith(pre):
                name = name[len(pre):]
                break
        name = name.replace(".gamma", ".weight").replace(".beta", ".bias") if "LayerNorm" in name else name
        target = None
        for rx, rep in rules:
            m = rx.fullmatch(name)
            if m:
                target = m.expand(rep)
                break
        if target is None:
            if not any(rx.fullmatch(name) for rx in ignore):
                unknown.append(key)
            continue
        if any(rx.fullmatch(name) for rx in transposed):
            tensor = tensor.t()
        if target in out:
            raise UserError(f"{where}: two checkpoint tensors map onto {target!r} (second: {key!r})")
        out[target] = tensor
    if unknown:
        raise UserError(f"{where}: {len(unknown)} unexpected tensor(s) for {arch.family}, e.g. {unknown[0]!r}; "
                        f"is this a {arch.family} checkpoint?")
    missing = [k for k in ours if k not in out]
    if missing:
        raise UserError(f"{where}: checkpoint is missing {len(missing)} tensor(s) for {arch.family}, e.g. {missing[0]!r}")
    extra = [k for k in out if k not in ours]
    if extra:
        raise UserError(f"{where}: tensor {extra[0]!r} has no place in our {arch.family} model (config mismatch?)")
    for k, t in out.items():
        if tuple(t.shape) != tuple(ours[k].shape):
            raise UserError(f"{where}: shape mismatch for {k!r}: checkpoint {tuple(t.shape)}, config {tuple(ours[k].shape)}")
    return out
