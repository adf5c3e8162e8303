"""ModernBERT: a pre-LN rotary encoder, global attention every few layers and bidirectional local windows
between, two RoPE bases, GeGLU, bias-free LayerNorms (core/modernbert.py)."""
from __future__ import annotations

from attn_explorer.core.modernbert import ModernBert, ModernBertConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, B as _B, Architecture, act, layer_types, norm_eps, rope,
                                               rope_positions, width)


def _modernbert_config(cfg: dict) -> ModernBertConfig:
    family = "modernbert"
    heads = cfg["num_attention_heads"]
    head_dim = cfg["hidden_size"] // heads if isinstance(heads, int) and heads > 0 else 1
    # Configs written before transformers 5 give the pattern as a number and the two bases by name; the
    # shared readers take layer_types and rope_parameters (one entry per layer type) first.
    every = width(cfg, "global_attn_every_n_layers", 3)
    types = layer_types(cfg, family, lambda n: ["sliding_attention" if i % every else "full_attention"
                                                for i in range(n)])
    half = width(cfg, "local_attention", 128) // 2  # local_attention is the whole window: ±half around a token
    theta, fraction, scaling = rope(cfg, family, head_dim, theta=cfg.get("global_rope_theta", 160_000.0))
    local_theta, local_fraction, local_scaling = rope(cfg, family, head_dim, theta=cfg.get("local_rope_theta", 10_000.0),
                                                      layer_kind="sliding_attention")
    if fraction != 1.0 or local_fraction != 1.0:
        raise UserError(f"{family} with partial_rotary_factor is not supported")
    flags = {k: cfg.get(k, False) for k in ("attention_bias", "mlp_bias", "norm_bias")}
    return ModernBertConfig(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"], num_heads=heads,
        mlp_hidden=cfg["intermediate_size"],
        max_positions=rope_positions(cfg.get("max_position_embeddings", 8192), scaling),
        eps=norm_eps(cfg, "norm_eps", 1e-5), act=act(cfg, "hidden_activation"), **flags,
        windows=[half if t == "sliding_attention" else None for t in types],
        rope_theta=theta, rope_local_theta=local_theta, rope_scaling=scaling, rope_local_scaling=local_scaling,
    )


_ML = r"layers\.(\d+)\."
MODERNBERT_RULES = [
    (r"embeddings\.tok_embeddings\.weight", "embeddings.word.weight"),
    (r"embeddings\.norm\.(weight|bias)", r"embeddings.norm.\1"),
    (_ML + r"attn_norm\.(weight|bias)", _B + r"norm1.\2"),  # none in layer 0
    (_ML + r"attn\.Wqkv\.(weight|bias)", _B + r"attn.qkv.\2"),  # q, k, v stacked: view(3, H, d_k)
    (_ML + r"attn\.Wo\.(weight|bias)", _B + r"attn.out.\2"),
    (_ML + r"mlp_norm\.(weight|bias)", _B + r"norm2.\2"),
    (_ML + r"mlp\.Wi\.(weight|bias)", _B + r"mlp.gate_up.\2"),  # the activated input half first, then the gate
    (_ML + r"mlp\.Wo\.(weight|bias)", _B + r"mlp.down.\2"),
    (r"final_norm\.(weight|bias)", r"norm.\1"),
]
MODERNBERT_NAMES = {"dim": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                    "mlp_hidden": "intermediate_size", "max_positions": "max_position_embeddings", "eps": "norm_eps"}

ARCHITECTURES["modernbert"] = Architecture(
    "modernbert", "text", ModernBert, _modernbert_config, MODERNBERT_RULES, ("model.",),
    ignore=(r"head\..*", r"decoder\..*", r"classifier\..*"),  # the MLM / classification heads
    names=MODERNBERT_NAMES,
)
