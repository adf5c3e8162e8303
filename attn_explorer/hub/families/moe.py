"""Mixture-of-experts decoders on our Llama-style model: Qwen3-MoE (Qwen3's attention with q/k norms, and
an MLP of routed experts, core.moe, on the layers decoder_sparse_step and mlp_only_layers give; the others
keep Qwen3's dense SwiGLU at intermediate_size).

The shared readers here (`whole`, `moe_layers_every`) check the MoE fields of config.json for every MoE
family: a broken one is one UserError line naming the family and the field."""
from __future__ import annotations

from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.moe import MoEConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import ARCHITECTURES, B as _B, Architecture, json_kind, window
from attn_explorer.hub.families.decoders import ROPE_BUFFERS, QWEN3_RULES, rotary_decoder


def whole(cfg: dict, family: str, key: str, default=None, low: int = 1) -> int:
    """A whole-number field >= low (num_experts, num_experts_per_tok, ...); missing with no default: refused."""
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise UserError(f"{family}: {key} must be a whole number >= {low}, got {v!r}")
    return v


def flag(cfg: dict, family: str, key: str, default: bool) -> bool:
    v = cfg.get(key, default)
    if not isinstance(v, bool):
        raise UserError(f"{family}: {key} must be true or false, got {json_kind(v)} {v!r}")
    return v


def num_experts(cfg: dict, family: str, default: int) -> int:
    """The routed experts per layer: num_experts (the hub's files) or num_local_experts (what transformers 5
    writes for it); both, differing, is refused."""
    keys = [k for k in ("num_experts", "num_local_experts") if k in cfg]
    if len(keys) == 2 and cfg[keys[0]] != cfg[keys[1]]:
        raise UserError(f"{family}: num_experts ({cfg[keys[0]]!r}) and num_local_experts ({cfg[keys[1]]!r}) differ")
    return whole(cfg, family, keys[0] if keys else "num_experts", default, low=0)


def moe_layers_every(cfg: dict, family: str, step: int, dense: list) -> list[bool]:
    """Per layer, True where it is MoE: every step-th layer (counting from 1), except the dense list's."""
    n = cfg["num_hidden_layers"]
    if not isinstance(dense, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n
                                          for i in dense):
        raise UserError(f"{family}: mlp_only_layers must list layer numbers 0..{n - 1}, got {dense!r}")
    return [(i + 1) % step == 0 and i not in dense for i in range(n)]


def _qwen3_moe_config(cfg: dict) -> LlamaConfig:
    f = "qwen3_moe"
    experts = num_experts(cfg, f, 128)
    layers = [False] * cfg["num_hidden_layers"]
    moe = None
    if experts:  # transformers: num_experts 0 makes every layer dense
        k = whole(cfg, f, "num_experts_per_tok", 8)
        if k > experts:
            raise UserError(f"{f}: num_experts_per_tok ({k}) is more than num_experts ({experts})")
        moe = MoEConfig(num_experts=experts, top_k=k, hidden=whole(cfg, f, "moe_intermediate_size", 768),
                        scoring="softmax", norm_topk=flag(cfg, f, "norm_topk_prob", False))
        step = whole(cfg, f, "decoder_sparse_step", 1)
        layers = moe_layers_every(cfg, f, step, cfg.get("mlp_only_layers") or [])
    w = window(cfg, f) if cfg.get("use_sliding_window") else None  # every layer's, where use_sliding_window
    return rotary_decoder(cfg, f, qk_norm=True, attention_bias=bool(cfg.get("attention_bias", False)),
                           sliding_windows=[w] * cfg["num_hidden_layers"] if w else None,
                           moe=moe if any(layers) else None, moe_layers=layers if any(layers) else None)


_LL = r"layers\.(\d+)\."
QWEN3_MOE_RULES = QWEN3_RULES + [
    (_LL + r"mlp\.gate\.weight", _B + r"mlp.router.weight"),
    (_LL + r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", _B + r"mlp.experts.\2.\3.weight"),
]

ARCHITECTURES.update({
    "qwen3_moe": Architecture("qwen3_moe", "text", Llama, _qwen3_moe_config, QWEN3_MOE_RULES, ("model.",),
                              ignore=ROPE_BUFFERS),
})
