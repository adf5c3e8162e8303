"""Decoders: GPT-2 and OPT (learned positions, LayerNorm), and the rotary decoders on our one Llama-style
model: Llama (SmolLM2), Qwen2/2.5, Qwen3, Mistral, Phi-3, GPT-NeoX (Pythia), SmolLM3 (NoPE layers),
Granite (multipliers). The rotary ones share one reader (`rotary_decoder`); each row sets only its
switches. Other family modules (OLMo, ...) build on the public `rotary_decoder` and `ROPE_BUFFERS`."""
from __future__ import annotations

import math

from attn_explorer.core.gpt2 import GPT2, GPT2Config
from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, ATTENTION_RULES, B as _B, EMBED_RULE, FINAL_RULES,
                                               NORM1_RULE, Architecture, act, layer_types, layer_windows, norm_eps,
                                               rope, rope_positions, width, window)

# ---- GPT-2: causal, pre-LN, fused QKV in Conv1D (in, out) layout -------------------------------

def _gpt2_config(cfg: dict) -> GPT2Config:
    if cfg.get("scale_attn_by_inverse_layer_idx"):
        raise UserError("GPT-2 with scale_attn_by_inverse_layer_idx is not supported")
    if cfg.get("scale_attn_weights") is False:
        raise UserError("GPT-2 with scale_attn_weights=false is not supported")
    return GPT2Config(
        vocab_size=cfg["vocab_size"], dim=cfg["n_embd"], num_layers=cfg["n_layer"], num_heads=cfg["n_head"],
        mlp_hidden=cfg.get("n_inner") or 4 * cfg["n_embd"], max_positions=cfg["n_positions"],
        eps=norm_eps(cfg, "layer_norm_epsilon", 1e-5), act=act(cfg, "activation_function"),
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

def _opt_config(cfg: dict) -> GPT2Config:
    if cfg.get("layer_norm_elementwise_affine") is False:
        raise UserError("OPT with layer_norm_elementwise_affine=false is not supported")
    post_ln = cfg.get("do_layer_norm_before", True) is False
    return GPT2Config(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"], mlp_hidden=cfg["ffn_dim"], max_positions=cfg["max_position_embeddings"],
        eps=1e-5, act=act(cfg, "activation_function"),  # OPT's LayerNorms keep torch's default epsilon
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)), fused_qkv=False, position_offset=2,
        embed_dim=width(cfg, "word_embed_proj_dim", cfg["hidden_size"]), norm_first=not post_ln,
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

# ---- the rotary decoders: Llama, Qwen2/2.5, Qwen3, Mistral, Phi-3, GPT-NeoX (Pythia) ---------------
# One LlamaConfig, its switches read from config.json; fused checkpoint tensors map 1:1 onto fused modules.

def _qwen_windows(cfg: dict, family: str) -> list | None:
    """Qwen2/Qwen3: the window only where use_sliding_window, on the layers layer_types marks
    'sliding_attention' (or, without layer_types, those from max_window_layers up), as transformers does."""
    w = window(cfg, family) if cfg.get("use_sliding_window") else None
    first = cfg.get("max_window_layers", 28)
    types = layer_types(cfg, family, lambda n: ["sliding_attention" if w is not None and i >= first
                                                else "full_attention" for i in range(n)])
    windows = layer_windows(types, w)
    return windows if any(windows) else None


def _every_layer_window(cfg: dict, family: str) -> list | None:
    w = window(cfg, family)
    return None if w is None else [w] * cfg["num_hidden_layers"]


def rotary_decoder(cfg: dict, family: str, **fields) -> LlamaConfig:
    """What every rotary decoder shares with Llama (RMSNorm, SwiGLU, GQA, untied by default); fields
    override the defaults read here."""
    activation = act(cfg, "hidden_act")
    if fields.get("mlp", "swiglu") == "swiglu" and activation != "silu":
        raise UserError(f"{family} with hidden_act {cfg.get('hidden_act')!r} is not supported (only silu)")
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    theta, fraction, scaling = rope(cfg, family, head_dim, **fields.pop("rope_defaults", {}))
    if int(head_dim * fraction) % 2:
        raise UserError(f"{family}: RoPE needs an even number of rotated dimensions, got {int(head_dim * fraction)}")
    base = dict(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        mlp_hidden=cfg["intermediate_size"], max_positions=rope_positions(cfg.get("max_position_embeddings", 2048),
                                                                          scaling),
        eps=norm_eps(cfg, "rms_norm_eps", 1e-6), rope_theta=theta, rotary_fraction=fraction, rope_scaling=scaling,
        act=activation,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        head_size=head_dim if head_dim * heads != cfg["hidden_size"] else None,
    )
    base.update(fields)
    # A window no shorter than the positions the model may run never cuts a key (Phi-3.5-mini and
    # Phi-4-mini ship sliding_window 262144 beside 131072 positions): those layers are global, and say so.
    windows = base.get("sliding_windows")
    if windows:
        windows = [w if w is not None and w < base["max_positions"] else None for w in windows]
        base["sliding_windows"] = windows if any(windows) else None
    return LlamaConfig(**base)


def _llama_config(cfg: dict) -> LlamaConfig:
    return rotary_decoder(cfg, "llama", attention_bias=bool(cfg.get("attention_bias", False)),
                           mlp_bias=bool(cfg.get("mlp_bias", False)))


def _qwen2_config(cfg: dict) -> LlamaConfig:
    return rotary_decoder(cfg, "qwen2", qkv_bias=True, sliding_windows=_qwen_windows(cfg, "qwen2"))


def _qwen3_config(cfg: dict) -> LlamaConfig:
    return rotary_decoder(cfg, "qwen3", qk_norm=True, attention_bias=bool(cfg.get("attention_bias", False)),
                           sliding_windows=_qwen_windows(cfg, "qwen3"))


def _mistral_config(cfg: dict) -> LlamaConfig:
    return rotary_decoder(cfg, "mistral", sliding_windows=_every_layer_window(cfg, "mistral"))


def _phi3_config(cfg: dict) -> LlamaConfig:
    # transformers' Phi3Config: the old "su" and "yarn" are LongRoPE, and its top-level
    # original_max_position_embeddings (4096 when config.json has none) outranks the rope entry's
    cfg = {"original_max_position_embeddings": 4096, **cfg}
    return rotary_decoder(cfg, "phi3", rope_defaults=dict(aliases={"su": "longrope", "yarn": "longrope"}),
                           sliding_windows=_every_layer_window(cfg, "phi3"), qkv_layout="stacked",
                           fused_gate_up=True)


def _gpt_neox_config(cfg: dict) -> LlamaConfig:
    if cfg.get("hidden_size", 0) % max(1, cfg.get("num_attention_heads", 1)):
        raise UserError("gpt_neox: hidden_size must be a multiple of num_attention_heads")
    return rotary_decoder(
        cfg, "gpt_neox", rope_defaults=dict(fraction=0.25), norm="layer", mlp="mlp", mlp_bias=True,
        eps=norm_eps(cfg, "layer_norm_eps", 1e-5), attention_bias=bool(cfg.get("attention_bias", True)),
        parallel_residual=bool(cfg.get("use_parallel_residual", True)), num_kv_heads=cfg["num_attention_heads"],
        qkv_layout="per_head",
    )


def _smollm3_nope(cfg: dict) -> list[bool]:
    """Per layer, True where SmolLM3 uses no RoPE: no_rope_layers lists 1 (RoPE) or 0 (none) per layer;
    without it, every no_rope_layer_interval-th layer (4 by default) has none, as transformers builds it."""
    n = cfg["num_hidden_layers"]
    flags = cfg.get("no_rope_layers")
    if flags is None:
        every = cfg.get("no_rope_layer_interval", 4)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise UserError(f"smollm3: no_rope_layer_interval must be a whole number >= 1, got {every!r}")
        flags = [int((i + 1) % every != 0) for i in range(n)]
    if not isinstance(flags, list) or len(flags) != n or any(f not in (0, 1) for f in flags):
        raise UserError(f"smollm3: no_rope_layers must list 1 (RoPE) or 0 (none) per layer ({n}), got {flags!r}")
    return [not f for f in flags]


def _smollm3_config(cfg: dict) -> LlamaConfig:
    nope = _smollm3_nope(cfg)
    w = window(cfg, "smollm3") if cfg.get("use_sliding_window") else None
    # transformers' default layer_types: a window on the NoPE layers where use_sliding_window
    types = layer_types(cfg, "smollm3", lambda n: ["sliding_attention" if w is not None and nope[i]
                                                   else "full_attention" for i in range(n)])
    windows = layer_windows(types, w)
    return rotary_decoder(cfg, "smollm3", rope_defaults=dict(theta=2_000_000.0),
                           attention_bias=bool(cfg.get("attention_bias", False)),
                           mlp_bias=bool(cfg.get("mlp_bias", False)),
                           tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                           sliding_windows=windows if any(windows) else None,
                           nope_layers=nope if any(nope) else None)


def _multiplier(cfg: dict, name: str) -> float:
    m = cfg.get(name, 1.0)
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m == 0:
        raise UserError(f"granite: {name} must be a finite non-zero number, got {m!r}")
    return float(m)


def _granite_config(cfg: dict) -> LlamaConfig:
    return rotary_decoder(cfg, "granite", attention_bias=bool(cfg.get("attention_bias", False)),
                           mlp_bias=bool(cfg.get("mlp_bias", False)),
                           embed_multiplier=_multiplier(cfg, "embedding_multiplier"),
                           attn_scale=_multiplier(cfg, "attention_multiplier"),
                           residual_multiplier=_multiplier(cfg, "residual_multiplier"),
                           logits_divisor=_multiplier(cfg, "logits_scaling"))


_LL = r"layers\.(\d+)\."
LLAMA_RULES = [
    EMBED_RULE,
    NORM1_RULE,
    *ATTENTION_RULES,
    (_LL + r"post_attention_layernorm\.weight", _B + r"norm2.weight"),
    (_LL + r"mlp\.(gate|up|down)_proj\.(weight|bias)", _B + r"mlp.\2.\3"),
    *FINAL_RULES,
]

ROPE_BUFFERS = (r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"rotary_emb\.inv_freq")
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

ARCHITECTURES.update({
    "gpt2": Architecture(
        "gpt2", "text", GPT2, _gpt2_config, GPT2_RULES, ("transformer.",),
        ignore=(r"h\.\d+\.attn\.(bias|masked_bias)", r"score\..*"),
        transposed=(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight",),
    ),
    "opt": Architecture(
        "opt", "text", GPT2, _opt_config, OPT_RULES, ("model.decoder.", "decoder."),
        ignore=(r"score\..*", r"qa_outputs\..*"), names=OPT_NAMES,
    ),
    "llama": Architecture("llama", "text", Llama, _llama_config, LLAMA_RULES, ("model.",), ignore=ROPE_BUFFERS),
    "qwen2": Architecture("qwen2", "text", Llama, _qwen2_config, LLAMA_RULES, ("model.",), ignore=ROPE_BUFFERS),
    "qwen3": Architecture("qwen3", "text", Llama, _qwen3_config, QWEN3_RULES, ("model.",), ignore=ROPE_BUFFERS),
    "mistral": Architecture("mistral", "text", Llama, _mistral_config, LLAMA_RULES, ("model.",), ignore=ROPE_BUFFERS),
    "smollm3": Architecture("smollm3", "text", Llama, _smollm3_config, LLAMA_RULES, ("model.",),
                            ignore=ROPE_BUFFERS),
    "granite": Architecture("granite", "text", Llama, _granite_config, LLAMA_RULES, ("model.",), ignore=ROPE_BUFFERS),
    "phi3": Architecture("phi3", "text", Llama, _phi3_config, PHI3_RULES, ("model.",), ignore=ROPE_BUFFERS),
    "gpt_neox": Architecture(
        "gpt_neox", "text", Llama, _gpt_neox_config, GPT_NEOX_RULES, ("gpt_neox.",),
        ignore=(r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)", r"rotary_emb\.inv_freq"),
        names={"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
               "mlp_hidden": "intermediate_size", "max_positions": "max_position_embeddings", "eps": "layer_norm_eps"},
    ),
})
