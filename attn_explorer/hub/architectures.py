"""One row per architecture: how an HF config becomes our config, and how HF tensor names map to ours.

Adding a family means adding a row: a config translator, a name map (regex -> our name, with an
optional transform), the task-head prefixes to strip, and the keys we knowingly leave out.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from attn_explorer.core.clip_text import ClipTextConfig, ClipTextTransformer
from attn_explorer.core.encoder import EncoderConfig, TextEncoder
from attn_explorer.core.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from attn_explorer.core.gpt2 import GPT2, GPT2Config
from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.vit import ViTConfig, VisionTransformer
from attn_explorer.errors import UserError

ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu",
        "quick_gelu": "quick_gelu"}


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
    names: dict[str, str] | None = None  # our config field -> config.json's name, for messages (default: HF_NAMES)


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
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
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
    (r"lm_head\.weight", "lm_head.weight"),  # untied only (see `decoder_head`)
]

# ---- OPT: GPT-2's decoder with q/k/v apart, positions offset by 2, ReLU ---------------------------

def _width(cfg: dict, key: str, default: int) -> int:
    """An optional width field (OPT's word_embed_proj_dim, ELECTRA's embedding_size): a whole number >= 1."""
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise UserError(f"{key} must be a whole number >= 1, got {v!r}")
    return v


def _opt_config(cfg: dict) -> GPT2Config:
    if cfg.get("layer_norm_elementwise_affine") is False:
        raise UserError("OPT with layer_norm_elementwise_affine=false is not supported")
    post_ln = cfg.get("do_layer_norm_before", True) is False
    return GPT2Config(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"], mlp_hidden=cfg["ffn_dim"], max_positions=cfg["max_position_embeddings"],
        eps=1e-5, act=_act(cfg, "activation_function"),  # OPT's LayerNorms keep torch's default epsilon
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)), fused_qkv=False, position_offset=2,
        embed_dim=_width(cfg, "word_embed_proj_dim", cfg["hidden_size"]), norm_first=not post_ln,
        # OPT-350m (post-LN) has no final norm; _remove_final_layer_norm marks checkpoints older than the fix
        final_norm=not post_ln and not cfg.get("_remove_final_layer_norm", False),
        bias=bool(cfg.get("enable_bias", True)),
    )


_OL = r"layers\.(\d+)\."
OPT_RULES = [
    (r"embed_tokens\.weight", "wte.weight"),
    (r"embed_positions\.weight", "wpe.weight"),
    (r"project_in\.weight", "project_in.weight"),
    (r"project_out\.weight", "project_out.weight"),
    (_OL + r"self_attn_layer_norm\.(weight|bias)", _B + r"norm1.\2"),
    (_OL + r"self_attn\.q_proj\.(weight|bias)", _B + r"attn.query.\2"),
    (_OL + r"self_attn\.k_proj\.(weight|bias)", _B + r"attn.key.\2"),
    (_OL + r"self_attn\.v_proj\.(weight|bias)", _B + r"attn.value.\2"),
    (_OL + r"self_attn\.out_proj\.(weight|bias)", _B + r"attn.out.\2"),
    (_OL + r"final_layer_norm\.(weight|bias)", _B + r"norm2.\2"),
    (_OL + r"fc(1|2)\.(weight|bias)", _B + r"mlp.fc\2.\3"),
    (r"final_layer_norm\.(weight|bias)", r"ln_f.\1"),
    (r"lm_head\.weight", "lm_head.weight"),  # untied only (see `decoder_head`)
]
OPT_NAMES = {"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
             "mlp_hidden": "ffn_dim", "max_positions": "max_position_embeddings", "embed_dim": "word_embed_proj_dim"}

# ---- DistilBERT: BERT's post-LN encoder without token types, other names -------------------------

def _distilbert_config(cfg: dict) -> EncoderConfig:
    # sinusoidal_pos_embds: DistilBERT fills its position table with sin/cos once and saves it like a
    # learned one, so both kinds are read from the checkpoint's embeddings.position_embeddings.weight.
    return EncoderConfig(
        vocab_size=cfg["vocab_size"], dim=cfg["dim"], num_layers=cfg["n_layers"], num_heads=cfg["n_heads"],
        mlp_hidden=cfg["hidden_dim"], max_positions=cfg["max_position_embeddings"], type_vocab_size=0,
        eps=1e-12, act=_act(cfg, "activation"), pad_token_id=cfg.get("pad_token_id") or 0,
    )


_DL = r"transformer\.layer\.(\d+)\."
DISTILBERT_RULES = [
    (r"embeddings\.word_embeddings\.(weight)", r"embeddings.word.\1"),
    (r"embeddings\.position_embeddings\.(weight)", r"embeddings.position.\1"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"embeddings.norm.\1"),
    (_DL + r"attention\.q_lin\.(weight|bias)", _B + r"attn.query.\2"),
    (_DL + r"attention\.k_lin\.(weight|bias)", _B + r"attn.key.\2"),
    (_DL + r"attention\.v_lin\.(weight|bias)", _B + r"attn.value.\2"),
    (_DL + r"attention\.out_lin\.(weight|bias)", _B + r"attn.out.\2"),
    (_DL + r"sa_layer_norm\.(weight|bias)", _B + r"norm1.\2"),
    (_DL + r"ffn\.lin(1|2)\.(weight|bias)", _B + r"mlp.fc\2.\3"),
    (_DL + r"output_layer_norm\.(weight|bias)", _B + r"norm2.\2"),
]
DISTILBERT_NAMES = {"num_layers": "n_layers", "num_heads": "n_heads", "mlp_hidden": "hidden_dim",
                    "max_positions": "max_position_embeddings"}

# ---- ELECTRA (the discriminator or the generator's encoder): BERT with narrower embeddings --------

def _electra_config(cfg: dict) -> EncoderConfig:
    return dataclasses.replace(_encoder_config(cfg), embed_dim=_width(cfg, "embedding_size", cfg["hidden_size"]))

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
    (r"lm_head\.weight", "lm_head.weight"),  # untied only (see `decoder_head`)
]

# ---- the rotary decoders beyond Llama: Qwen2/2.5, Qwen3, Mistral, Phi-3, GPT-NeoX (Pythia) -------
# One LlamaConfig, its switches read from config.json; fused checkpoint tensors map 1:1 onto fused modules.

def _rope(cfg: dict, family: str, theta: float = 10000.0, fraction: float = 1.0) -> tuple[float, float]:
    """(rope_theta, the rotated share of d_k) from transformers 5's rope_parameters or the older
    rope_theta / rope_scaling / partial_rotary_factor (GPT-NeoX: rotary_emb_base, rotary_pct).
    Only plain RoPE: any rope scaling is refused in one line."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for p in (params, scaling):
        if not isinstance(p, dict):
            raise UserError(f"{family}: rope_parameters / rope_scaling must be an object, not {_json_kind(p)}")
    kind = scaling.get("rope_type", scaling.get("type")) or params.get("rope_type", "default")
    if kind != "default":
        raise UserError(f"{family} with rope_scaling {kind!r} is not supported (only plain RoPE)")
    theta = params.get("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", theta)))
    fraction = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", cfg.get("rotary_pct", fraction)))
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise UserError(f"{family}: the rotary share (rotary_pct / partial_rotary_factor) must be in (0, 1], "
                        f"got {fraction!r}")
    return float(theta), float(fraction)


def _window(cfg: dict, family: str) -> int | None:
    w = cfg.get("sliding_window")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
        raise UserError(f"{family}: sliding_window must be a whole number >= 1 or null, got {w!r}")
    return w


def _qwen_windows(cfg: dict, family: str) -> list | None:
    """Qwen2/Qwen3: the window only where use_sliding_window, on the layers layer_types marks
    'sliding_attention' (or, without layer_types, those from max_window_layers up), as transformers does."""
    w = _window(cfg, family) if cfg.get("use_sliding_window") else None
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        first = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if w is not None and i >= first else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or not set(types) <= {"full_attention", "sliding_attention"}:
        raise UserError(f"{family}: layer_types must list 'full_attention' or 'sliding_attention' for each of the "
                        f"{n} layers")
    windows = [w if t == "sliding_attention" else None for t in types]
    return windows if any(windows) else None


def _rotary_decoder(cfg: dict, family: str, **fields) -> LlamaConfig:
    """What Qwen2, Qwen3, Mistral and Phi-3 share with Llama (RMSNorm, SwiGLU, GQA, untied by default)."""
    act = _act(cfg, "hidden_act")
    if fields.get("mlp", "swiglu") == "swiglu" and act != "silu":
        raise UserError(f"{family} with hidden_act {cfg.get('hidden_act')!r} is not supported (only silu)")
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    theta, fraction = _rope(cfg, family, **fields.pop("rope_defaults", {}))
    if int(head_dim * fraction) % 2:
        raise UserError(f"{family}: RoPE needs an even number of rotated dimensions, got {int(head_dim * fraction)}")
    base = dict(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        mlp_hidden=cfg["intermediate_size"], max_positions=cfg.get("max_position_embeddings", 2048),
        eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=theta, rotary_fraction=fraction, act=act,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        head_size=head_dim if head_dim * heads != cfg["hidden_size"] else None,
    )
    base.update(fields)
    return LlamaConfig(**base)


def _qwen2_config(cfg: dict) -> LlamaConfig:
    return _rotary_decoder(cfg, "qwen2", qkv_bias=True, sliding_windows=_qwen_windows(cfg, "qwen2"))


def _qwen3_config(cfg: dict) -> LlamaConfig:
    return _rotary_decoder(cfg, "qwen3", qk_norm=True, attention_bias=bool(cfg.get("attention_bias", False)),
                           sliding_windows=_qwen_windows(cfg, "qwen3"))


def _every_layer_window(cfg: dict, family: str) -> list | None:
    w = _window(cfg, family)
    return None if w is None else [w] * cfg["num_hidden_layers"]


def _mistral_config(cfg: dict) -> LlamaConfig:
    return _rotary_decoder(cfg, "mistral", sliding_windows=_every_layer_window(cfg, "mistral"))


def _phi3_config(cfg: dict) -> LlamaConfig:
    return _rotary_decoder(cfg, "phi3", sliding_windows=_every_layer_window(cfg, "phi3"), qkv_layout="stacked",
                           fused_gate_up=True)


def _gpt_neox_config(cfg: dict) -> LlamaConfig:
    if cfg.get("hidden_size", 0) % max(1, cfg.get("num_attention_heads", 1)):
        raise UserError("gpt_neox: hidden_size must be a multiple of num_attention_heads")
    return _rotary_decoder(
        cfg, "gpt_neox", rope_defaults=dict(fraction=0.25), norm="layer", mlp="mlp", mlp_bias=True,
        eps=cfg.get("layer_norm_eps", 1e-5), attention_bias=bool(cfg.get("attention_bias", True)),
        parallel_residual=bool(cfg.get("use_parallel_residual", True)), num_kv_heads=cfg["num_attention_heads"],
        qkv_layout="per_head",
    )


_ROPE_BUFFERS = (r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"rotary_emb\.inv_freq")
_NX = r"layers\.(\d+)\."
GPT_NEOX_RULES = [
    (r"embed_in\.weight", "embed_tokens.weight"),
    (_NX + r"input_layernorm\.(weight|bias)", _B + r"norm1.\2"),
    (_NX + r"attention\.query_key_value\.(weight|bias)", _B + r"attn.qkv.\2"),  # each head's q, k, v rows in turn
    (_NX + r"attention\.dense\.(weight|bias)", _B + r"attn.out.\2"),
    (_NX + r"post_attention_layernorm\.(weight|bias)", _B + r"norm2.\2"),
    (_NX + r"mlp\.dense_h_to_4h\.(weight|bias)", _B + r"mlp.fc1.\2"),
    (_NX + r"mlp\.dense_4h_to_h\.(weight|bias)", _B + r"mlp.fc2.\2"),
    (r"final_layer_norm\.(weight|bias)", r"norm.\1"),
    (r"(?:embed_out|lm_head)\.weight", "lm_head.weight"),  # untied only (see `decoder_head`)
]
QWEN3_RULES = LLAMA_RULES + [(_LL + r"self_attn\.(q|k)_norm\.weight", _B + r"attn.\2_norm.weight")]
PHI3_RULES = [  # fused: qkv_proj holds every q row, then k's, then v's; gate_up_proj the gate's rows, then up's
    (_LL + r"self_attn\.qkv_proj\.weight", _B + r"attn.qkv.weight"),
    (_LL + r"mlp\.gate_up_proj\.weight", _B + r"mlp.gate_up.weight"),
] + LLAMA_RULES

ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture("bert", "text", TextEncoder, _encoder_config, ENCODER_RULES, ("bert.",), TEXT_HEADS),
    "roberta": Architecture("roberta", "text", TextEncoder, _encoder_config, ENCODER_RULES, ("roberta.",), TEXT_HEADS),
    "gpt2": Architecture(
        "gpt2", "text", GPT2, _gpt2_config, GPT2_RULES, ("transformer.",),
        ignore=(r"h\.\d+\.attn\.(bias|masked_bias)", r"score\..*"),
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
    "opt": Architecture(
        "opt", "text", GPT2, _opt_config, OPT_RULES, ("model.decoder.", "decoder."),
        ignore=(r"score\..*", r"qa_outputs\..*"), names=OPT_NAMES,
    ),
    "distilbert": Architecture(
        "distilbert", "text", TextEncoder, _distilbert_config, DISTILBERT_RULES, ("distilbert.",),
        ignore=TEXT_HEADS + (r"vocab_(transform|layer_norm|projector)\..*", r"pre_classifier\..*"),
        names=DISTILBERT_NAMES,
    ),
    "electra": Architecture(
        "electra", "text", TextEncoder, _electra_config,
        ENCODER_RULES + [(r"embeddings_project\.(weight|bias)", r"embeddings.project.\1")], ("electra.",),
        ignore=TEXT_HEADS + (r"(discriminator|generator)_predictions\..*", r"generator_lm_head\..*"),
    ),
    "llama": Architecture(
        "llama", "text", Llama, _llama_config, LLAMA_RULES, ("model.",),
        ignore=(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"rotary_emb\.inv_freq"),
    ),
    "qwen2": Architecture("qwen2", "text", Llama, _qwen2_config, LLAMA_RULES, ("model.",), ignore=_ROPE_BUFFERS),
    "qwen3": Architecture("qwen3", "text", Llama, _qwen3_config, QWEN3_RULES, ("model.",), ignore=_ROPE_BUFFERS),
    "mistral": Architecture("mistral", "text", Llama, _mistral_config, LLAMA_RULES, ("model.",), ignore=_ROPE_BUFFERS),
    "phi3": Architecture("phi3", "text", Llama, _phi3_config, PHI3_RULES, ("model.",), ignore=_ROPE_BUFFERS),
    "gpt_neox": Architecture(
        "gpt_neox", "text", Llama, _gpt_neox_config, GPT_NEOX_RULES, ("gpt_neox.",),
        ignore=(r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)", r"rotary_emb\.inv_freq"),
        names={"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
               "mlp_hidden": "intermediate_size", "max_positions": "max_position_embeddings", "eps": "layer_norm_eps"},
    ),
}
# Same layout, other names.
for alias, target in {"xlm-roberta": "roberta", "camembert": "roberta"}.items():
    ARCHITECTURES[alias] = ARCHITECTURES[target]


# ---- CLIP and SigLIP towers: q/k/v/out_proj attention, layer_norm1/2 pre-LN blocks ----------------

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
    return _vit_config(c, eps=c["layer_norm_eps"], qkv_bias=True, patch_bias=False, pre_norm=True, norm_output=False,
                       flat_tables=True)


def _siglip_vision_config(cfg: dict) -> ViTConfig:
    c = _tower(cfg, "vision_config", SIGLIP_VISION_DEFAULTS)
    return _vit_config(c, eps=c["layer_norm_eps"], qkv_bias=True, class_token=False, flat_tables=True)


def _clip_text_config(cfg: dict) -> ClipTextConfig:
    c = _tower(cfg, "text_config", CLIP_TEXT_DEFAULTS)
    return ClipTextConfig(
        vocab_size=c["vocab_size"], dim=c["hidden_size"], num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"], mlp_hidden=c["intermediate_size"],
        max_positions=c["max_position_embeddings"], eps=c["layer_norm_eps"], act=_act(c),
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


# ---- BART: a post-LN encoder and a decoder with cross-attention, positions offset by 2 ------------

BART_DEFAULTS = dict(vocab_size=50265, d_model=1024, encoder_layers=12, decoder_layers=12,
                     encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                     decoder_ffn_dim=4096, max_position_embeddings=1024, activation_function="gelu",
                     scale_embedding=False, pad_token_id=1, decoder_start_token_id=2)


def _bart_config(cfg: dict) -> EncoderDecoderConfig:
    c = {**BART_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    if c.get("normalize_before") or c.get("add_final_layer_norm"):
        raise UserError("BART with normalize_before or add_final_layer_norm (pre-LN, mBART-style) is not supported")
    if isinstance(c["decoder_attention_heads"], int) and c["decoder_attention_heads"] >= 1 \
            and c["d_model"] % c["decoder_attention_heads"]:
        raise UserError(f"d_model {c['d_model']} is not divisible by decoder_attention_heads "
                        f"{c['decoder_attention_heads']} (each head gets an equal share of the width)")
    return EncoderDecoderConfig(
        vocab_size=c["vocab_size"], dim=c["d_model"], num_layers=c["encoder_layers"],
        num_heads=c["encoder_attention_heads"], mlp_hidden=c["encoder_ffn_dim"], decoder_layers=c["decoder_layers"],
        decoder_heads=c["decoder_attention_heads"], decoder_mlp_hidden=c["decoder_ffn_dim"],
        max_positions=c["max_position_embeddings"], act=_act(c, "activation_function"),
        scale_embedding=c["scale_embedding"], pad_token_id=c["pad_token_id"],
        decoder_start_token_id=c["decoder_start_token_id"],
    )


_BE, _BD = r"encoder\.layers\.(\d+)\.", r"decoder\.layers\.(\d+)\."
_QKVO = {"q": "query", "k": "key", "v": "value", "out": "out"}
BART_RULES = [
    (r"shared\.weight", "embed_tokens.weight"),
    (r"(encoder|decoder)\.embed_positions\.weight", r"\1.embed_positions.weight"),
    (r"(encoder|decoder)\.layernorm_embedding\.(weight|bias)", r"\1.embed_norm.\2"),
    *[(_BE + rf"self_attn\.{hf}_proj\.(weight|bias)", rf"encoder.blocks.layers.\1.attn.{ours}.\2")
      for hf, ours in _QKVO.items()],
    (_BE + r"self_attn_layer_norm\.(weight|bias)", r"encoder.blocks.layers.\1.norm1.\2"),
    (_BE + r"fc(1|2)\.(weight|bias)", r"encoder.blocks.layers.\1.mlp.fc\2.\3"),
    (_BE + r"final_layer_norm\.(weight|bias)", r"encoder.blocks.layers.\1.norm2.\2"),
    *[(_BD + rf"self_attn\.{hf}_proj\.(weight|bias)", rf"decoder.layers.\1.self_attn.{ours}.\2")
      for hf, ours in _QKVO.items()],
    *[(_BD + rf"encoder_attn\.{hf}_proj\.(weight|bias)", rf"decoder.layers.\1.cross_attn.{ours}.\2")
      for hf, ours in _QKVO.items()],
    (_BD + r"self_attn_layer_norm\.(weight|bias)", r"decoder.layers.\1.norm1.\2"),
    (_BD + r"encoder_attn_layer_norm\.(weight|bias)", r"decoder.layers.\1.norm_cross.\2"),
    (_BD + r"fc(1|2)\.(weight|bias)", r"decoder.layers.\1.mlp.fc\2.\3"),
    (_BD + r"final_layer_norm\.(weight|bias)", r"decoder.layers.\1.norm2.\2"),
]
# Both stacks read `shared` (older checkpoints also store tied copies under each stack); the LM head is
# the same table, its bias and the task heads are not read (no generation here).
BART_IGNORE = (r"(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight", r"final_logits_bias",
               r"classification_head\..*", r"qa_outputs\..*")
ARCHITECTURES["bart"] = Architecture("bart", "text", EncoderDecoder, _bart_config, BART_RULES, ("model.",),
                                     BART_IGNORE)


# ---- Gemma 2 and Gemma 3 (text): the Llama decoder with Gemma's switches set ----------------------

_GEMMA_DEFAULTS = {  # transformers' config defaults, where config.json may leave a field out
    "gemma2": dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=8192,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rope_theta=10000.0),
    "gemma3_text": dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=131072,
                        final_logit_softcapping=None, rope_theta=1_000_000.0, rope_local_base_freq=10000.0),
}


def _gemma_layer_types(cfg: dict, family: str) -> list[str]:
    """config.json's layer_types, or transformers' default pattern: Gemma 2 alternates local and global
    (every 2nd layer global); Gemma 3 has sliding_window_pattern - 1 local layers to 1 global (6 by default)."""
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        every = 2 if family == "gemma2" else int(cfg.get("sliding_window_pattern") or 6)
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n:
        raise UserError(f"layer_types must list one kind per layer ({n}), got {types!r}")
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise UserError(f"layer type {unknown[0]!r} is not supported (only sliding_attention and full_attention)")
    return types


def _gemma_rope(cfg: dict, family: str) -> tuple[float, float | None, float]:
    """(global base, local base or None, global linear factor) from rope_parameters (transformers 5:
    Gemma 3 keeps one entry per layer type) or the older rope_theta / rope_local_base_freq / rope_scaling."""
    d = _GEMMA_DEFAULTS[family]
    params = cfg.get("rope_parameters") or {}
    nested = family == "gemma3_text" and ("full_attention" in params or "sliding_attention" in params)
    full = (params.get("full_attention") or {}) if nested else dict(params)
    if not nested and cfg.get("rope_scaling"):
        full = {**full, **cfg["rope_scaling"]}
    local = (params.get("sliding_attention") or {}) if nested else {}
    for which, p in (("global", full), ("local", local)):
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in ("default", "linear") or (kind == "linear" and which == "local"):
            raise UserError(f"Gemma with {which} rope type {kind!r} is not supported (only plain, or linear on "
                            "the global layers)")
    theta = float(full.get("rope_theta", cfg.get("rope_theta", d["rope_theta"])))
    factor = float(full.get("factor", 1.0)) if full.get("rope_type", full.get("type")) == "linear" else 1.0
    local_theta = None
    if family == "gemma3_text":
        local_theta = float(local.get("rope_theta", cfg.get("rope_local_base_freq", d["rope_local_base_freq"])))
    return theta, local_theta, factor


def _gemma_config(cfg: dict) -> LlamaConfig:
    multimodal = cfg.get("model_type") == "gemma3"
    if multimodal:  # the multimodal config: its language model is text_config
        cfg = dict(cfg.get("text_config") or {})
        cfg.setdefault("model_type", "gemma3_text")
    family = cfg.get("model_type")
    if family not in _GEMMA_DEFAULTS:
        raise UserError(f"Gemma model_type {family!r} is not supported (gemma2, gemma3_text, gemma3)")
    d = _GEMMA_DEFAULTS[family]
    if cfg.get("use_bidirectional_attention"):
        raise UserError("Gemma with use_bidirectional_attention (an encoder such as EmbeddingGemma) is not supported")
    act = _act({"hidden_act": cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"})
    heads = cfg["num_attention_heads"]
    window = cfg.get("sliding_window", d["sliding_window"])
    types = _gemma_layer_types(cfg, family)
    theta, local_theta, factor = _gemma_rope(cfg, family)
    head_dim = cfg.get("head_dim", d["head_dim"])
    # Gemma3ForConditionalGeneration's head applies no final soft-cap (the checkpoints set none anyway)
    softcap = None if multimodal else cfg.get("final_logit_softcapping", d["final_logit_softcapping"])
    return LlamaConfig(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        mlp_hidden=cfg["intermediate_size"], max_positions=cfg.get("max_position_embeddings", d["max_position_embeddings"]),
        eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=theta, tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        attention_bias=bool(cfg.get("attention_bias", False)), head_size=head_dim, norm="rms1p", act=act,
        sandwich_norms=True, scale_embeddings=True, qk_norm=family == "gemma3_text",
        attn_scale=float(cfg.get("query_pre_attn_scalar", d["query_pre_attn_scalar"])) ** -0.5,
        # transformers' Gemma 3 attention never applies attn_logit_softcapping, so neither do we
        attn_softcap=cfg.get("attn_logit_softcapping", d["attn_logit_softcapping"]) if family == "gemma2" else None,
        final_softcap=None if softcap is None else float(softcap),
        sliding_windows=[window if t == "sliding_attention" and window else None for t in types],
        rope_local_theta=local_theta, rope_linear_factor=factor,
    )


GEMMA_RULES = [
    (r"embed_tokens\.weight", "embed_tokens.weight"),
    (_LL + r"input_layernorm\.weight", _B + r"norm1.weight"),
    (_LL + r"post_attention_layernorm\.weight", _B + r"post_attn_norm.weight"),  # not Llama's pre-MLP norm
    (_LL + r"pre_feedforward_layernorm\.weight", _B + r"norm2.weight"),
    (_LL + r"post_feedforward_layernorm\.weight", _B + r"post_mlp_norm.weight"),
    (_LL + r"self_attn\.q_proj\.(weight|bias)", _B + r"attn.query.\2"),
    (_LL + r"self_attn\.k_proj\.(weight|bias)", _B + r"attn.key.\2"),
    (_LL + r"self_attn\.v_proj\.(weight|bias)", _B + r"attn.value.\2"),
    (_LL + r"self_attn\.o_proj\.(weight|bias)", _B + r"attn.out.\2"),
    (_LL + r"self_attn\.(q|k)_norm\.weight", _B + r"attn.\2_norm.weight"),  # Gemma 3
    (_LL + r"mlp\.(gate|up|down)_proj\.(weight|bias)", _B + r"mlp.\2.\3"),
    (r"norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),  # untied only (see `decoder_head`)
]
for _mt in ("gemma2", "gemma3_text"):
    ARCHITECTURES[_mt] = Architecture(_mt, "text", Llama, _gemma_config, GEMMA_RULES, ("model.",))
# Gemma 3's multimodal checkpoints (model_type gemma3): the language model only; the SigLIP tower and
# its projector are left out, so the app shows the text attention of an image-text model.
ARCHITECTURES["gemma3"] = Architecture(
    "gemma3_text", "text", Llama, _gemma_config, GEMMA_RULES,
    ("model.language_model.", "language_model.model.", "model."),
    ignore=(r"vision_tower\..*", r"multi_modal_projector\..*"),
)


# ---- checking a translated config ---------------------------------------------------------------------

# Our config field -> the name config.json uses, per config class: messages name what the user can fix.
HF_NAMES = {
    "EncoderConfig": {"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                      "mlp_hidden": "intermediate_size", "max_positions": "max_position_embeddings",
                      "eps": "layer_norm_eps"},
    "GPT2Config": {"dim": "n_embd", "num_layers": "n_layer", "num_heads": "n_head", "mlp_hidden": "n_inner",
                   "max_positions": "n_positions", "eps": "layer_norm_epsilon"},
    "ViTConfig": {"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                  "mlp_hidden": "intermediate_size", "channels": "num_channels", "eps": "layer_norm_eps",
                  "layerscale": "layerscale_value"},
    "ClipTextConfig": {"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                       "mlp_hidden": "intermediate_size", "max_positions": "max_position_embeddings",
                       "eps": "layer_norm_eps"},
    "EncoderDecoderConfig": {"dim": "d_model", "num_layers": "encoder_layers", "num_heads": "encoder_attention_heads",
                             "mlp_hidden": "encoder_ffn_dim", "decoder_heads": "decoder_attention_heads",
                             "decoder_mlp_hidden": "decoder_ffn_dim", "max_positions": "max_position_embeddings"},
    "LlamaConfig": {"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                    "num_kv_heads": "num_key_value_heads", "mlp_hidden": "intermediate_size",
                    "max_positions": "max_position_embeddings", "eps": "rms_norm_eps"},
}
# every other int is a count or size >= 1; type_vocab_size 0: no token types (DistilBERT); token ids start at 0
_MAY_BE_ZERO = {"num_labels", "pad_token_id", "decoder_start_token_id", "position_offset", "type_vocab_size"}


def _json_kind(v: Any) -> str:
    return {list: "a list", str: "a string", dict: "an object", bool: "true/false", type(None): "null"}.get(
        type(v), "a number")


def check_config(cfg: Any, where: str, names: dict[str, str] | None = None) -> Any:
    """cfg (one of our config dataclasses) unchanged, or one UserError line naming the field as the user
    wrote it (names: our field -> theirs): whole numbers >= 1 for sizes and counts, finite non-negative
    epsilons, real true/false flags, a width the heads divide, patches no larger than the image."""
    names = names or {}
    shown = lambda f: names.get(f, f)  # noqa: E731
    for f in dataclasses.fields(cfg):
        v, kind = getattr(cfg, f.name), f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if kind == "int":
            low = 0 if f.name in _MAY_BE_ZERO else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UserError(f"{where}: {shown(f.name)} must be a whole number >= {low}, got {v!r}")
        elif kind in ("float", "float | None"):
            if v is None and kind == "float | None":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise UserError(f"{where}: {shown(f.name)} must be a finite number >= 0, got {v!r}")
        elif kind == "bool" and not isinstance(v, bool):
            raise UserError(f"{where}: {shown(f.name)} must be true or false, got {v!r}")
        elif kind == "str" and not isinstance(v, str):
            raise UserError(f"{where}: {shown(f.name)} must be a string, got {v!r}")
    if cfg.dim % cfg.num_heads:
        raise UserError(f"{where}: {shown('dim')} {cfg.dim} is not divisible by {shown('num_heads')} {cfg.num_heads} "
                        "(each head gets an equal share of the width)")
    if getattr(cfg, "num_kv_heads", None) and cfg.num_heads % cfg.num_kv_heads:
        raise UserError(f"{where}: {shown('num_heads')} {cfg.num_heads} is not a multiple of "
                        f"{shown('num_kv_heads')} {cfg.num_kv_heads}")
    if hasattr(cfg, "act") and cfg.act not in ACTS.values():
        raise UserError(f"{where}: activation {cfg.act!r} is not supported (supported: {', '.join(sorted(set(ACTS.values())))})")
    if hasattr(cfg, "patch_size") and cfg.patch_size > cfg.image_size:
        raise UserError(f"{where}: patch_size {cfg.patch_size} is larger than image_size {cfg.image_size}")
    return cfg


def translate_config(arch: "Architecture", hf_cfg: dict, where: str) -> Any:
    """config.json (already read) -> our config for arch, checked; every failure one UserError line."""
    try:
        cfg = arch.make_config(hf_cfg)
    except KeyError as e:
        raise UserError(f"{where}: missing field {e} for {arch.family}") from None
    except (TypeError, ValueError) as e:  # a string where a number belongs: "eight" * 4
        raise UserError(f"{where}: a field has the wrong type for {arch.family} ({e})") from None
    return check_config(cfg, where, arch.names or HF_NAMES.get(type(cfg).__name__))


def config_from_fields(cls: type, stored: Any, where: str) -> Any:
    """Our config class from the fields a checkpoint stored (missing ones take their defaults), checked."""
    if not isinstance(stored, dict):
        raise UserError(f"{where}: the stored config must be a JSON object, not {_json_kind(stored)}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(stored) - known)
    if unknown:
        raise UserError(f"{where}: unknown config field {unknown[0]!r} for {cls.__name__} (saved by a newer version?)")
    return check_config(cls(**stored), where)


def supported() -> str:
    return ", ".join(sorted(ARCHITECTURES))


def architecture_for(cfg: dict, where: str) -> Architecture:
    if not isinstance(cfg, dict):
        raise UserError(f"{where}: config.json must be a JSON object {{\"model_type\": ...}}, not {_json_kind(cfg)}")
    mt = cfg.get("model_type")
    if mt is None:
        raise UserError(f"{where}: config.json has no model_type; supported architectures: {supported()}")
    if mt not in ARCHITECTURES:
        raise UserError(f"{where}: unsupported architecture {mt!r}; supported architectures: {supported()}")
    return ARCHITECTURES[mt]


def decoder_head(cfg: Any, hf: dict) -> dict:
    """A decoder's LM head, from its config and the tensors: tied (the embedding is the head; a stored
    copy, as some checkpoints carry, is dropped, as transformers ties it anyway), its own lm_head.weight,
    or none at all: a bare base model (LlamaModel, GPT2Model) saved untied has no head to read, and
    `cfg.head` becomes False (attention and hidden states, no generation). Returns the tensors to map."""
    if not hasattr(cfg, "head"):
        return hf
    key = next((k for k in hf if k in ("lm_head.weight", "embed_out.weight") or k.endswith(".lm_head.weight")), None)
    if cfg.tie_embeddings:
        return {k: v for k, v in hf.items() if k != key}
    cfg.head = key is not None
    return hf


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
    hf_name = {id(t): k for k, t in hf.items()}
    for k, t in out.items():
        if not t.is_floating_point():  # integer weights would be copied in silently, or fail deep in torch
            name = hf_name.get(id(t), k)
            raise UserError(f"{where}: tensor {name!r} holds {str(t.dtype).replace('torch.', '')}; "
                            "weights must be floating-point")
    return out
