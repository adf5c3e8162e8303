"""OLMo 2 and OLMo 3: the Llama decoder with a norm after each branch and none before
(post_attention_layernorm, post_feedforward_layernorm), q and k each normalised over every head's
width before the head split, and OLMo 3's sliding-window layers (layer_types, with their own RoPE
entry where rope_parameters gives one per layer type)."""
from __future__ import annotations

from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.positional import RopeScaling
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import (ARCHITECTURES, ATTENTION_RULES, B as _B, EMBED_RULE, FINAL_RULES,
                                               Architecture, layer_types, layer_windows, rope, rope_entry, window)
from attn_explorer.hub.families.decoders import ROPE_BUFFERS, rotary_decoder

_THETA = {"olmo2": 10000.0, "olmo3": 500000.0}  # transformers' defaults where config.json has no rope_theta


def _olmo3_windows(cfg: dict) -> tuple[list, dict]:
    """OLMo 3's per-layer windows (transformers' default: 3 sliding layers to 1 full) and, where the
    sliding layers' RoPE differs from the full ones', its base and scaling: rope_parameters' own
    sliding_attention entry, or plain RoPE where the legacy rope_scaling (the hub's YaRN) scales the full
    layers only."""
    w = window(cfg, "olmo3", 4096)
    types = layer_types(cfg, "olmo3", lambda n: ["sliding_attention" if (i + 1) % 4 else "full_attention"
                                                 for i in range(n)])
    windows = layer_windows(types, w)
    fields = {}
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    full = rope(cfg, "olmo3", head_dim, theta=_THETA["olmo3"])
    if rope_entry(cfg, "olmo3")[1]:  # one RoPE entry per layer type
        local = rope(cfg, "olmo3", head_dim, theta=_THETA["olmo3"], layer_kind="sliding_attention")
    else:  # the hub's legacy rope_scaling (OLMo 3's YaRN): transformers scales the full layers only
        local = (full[0], full[1], RopeScaling())
    if local != full:
        if local[1] != full[1]:
            raise UserError("olmo3 with a different partial_rotary_factor on its sliding layers is not supported")
        if any(t == "sliding_attention" and not win for t, win in zip(types, windows)):
            raise UserError("olmo3: sliding layers without a sliding_window but with their own RoPE are "
                            "not supported")
        fields = dict(rope_local_theta=local[0], rope_local_scaling=local[2])
    return (windows if any(windows) else None), fields


def _olmo_config(cfg: dict) -> LlamaConfig:
    family = cfg.get("model_type")
    windows, rope_fields = _olmo3_windows(cfg) if family == "olmo3" else (None, {})
    return rotary_decoder(cfg, family, rope_defaults=dict(theta=_THETA[family]),
                           attention_bias=bool(cfg.get("attention_bias", False)), pre_norms=False,
                           sandwich_norms=True, qk_norm=True, qk_norm_full=True, sliding_windows=windows,
                           **rope_fields)


_LL = r"layers\.(\d+)\."
OLMO_RULES = [
    EMBED_RULE,
    *ATTENTION_RULES,
    (_LL + r"self_attn\.(q|k)_norm\.weight", _B + r"attn.\2_norm.weight"),  # over H·d_k (H_kv·d_k), not per head
    (_LL + r"post_attention_layernorm\.weight", _B + r"post_attn_norm.weight"),  # after the branch, not before
    (_LL + r"post_feedforward_layernorm\.weight", _B + r"post_mlp_norm.weight"),
    (_LL + r"mlp\.(gate|up|down)_proj\.(weight|bias)", _B + r"mlp.\2.\3"),
    *FINAL_RULES,
]
for _mt in ("olmo2", "olmo3"):
    ARCHITECTURES[_mt] = Architecture(_mt, "text", Llama, _olmo_config, OLMO_RULES, ("model.",), ignore=ROPE_BUFFERS)
