"""What every family row shares: the `Architecture` record, the one `ARCHITECTURES` table the family
modules append their rows to, and the readers of config.json fields that several families carry
(activations, optional widths, RoPE, sliding windows and layer types, norm epsilons). A family reads
these fields through here, never through its own copy, so one reader's fix reaches every family.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from attn_explorer.errors import UserError

ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu",
        "quick_gelu": "quick_gelu"}
B = r"blocks.layers.\1."  # our block's name, with the HF layer number as group 1


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


# model_type -> its row; each module of hub/families appends its own (see families/__init__.py)
ARCHITECTURES: dict[str, Architecture] = {}


def json_kind(v: Any) -> str:
    return {list: "a list", str: "a string", dict: "an object", bool: "true/false", type(None): "null"}.get(
        type(v), "a number")


def act(cfg: dict, key: str = "hidden_act", default: str = "gelu") -> str:
    name = cfg.get(key, default)
    if name not in ACTS:
        raise UserError(f"activation {name!r} is not supported (supported: {', '.join(ACTS)})")
    return ACTS[name]


def width(cfg: dict, key: str, default: int) -> int:
    """An optional width field (OPT's word_embed_proj_dim, ELECTRA's embedding_size): a whole number >= 1."""
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise UserError(f"{key} must be a whole number >= 1, got {v!r}")
    return v


def norm_eps(cfg: dict, key: str, default: float) -> float:
    """A norm's epsilon under the family's name for it (layer_norm_eps, layer_norm_epsilon, rms_norm_eps);
    check_config refuses one that is not a finite number >= 0 (a null too)."""
    return cfg.get(key, default)


# ---- RoPE ---------------------------------------------------------------------------------------------

def rope_kind(p: dict) -> str:
    """A rope_parameters / rope_scaling entry's type ("default" when it names none)."""
    return p.get("rope_type", p.get("type")) or "default"


def rope_fields(cfg: dict, family: str) -> tuple[dict, dict]:
    """(rope_parameters, rope_scaling) of config.json, each an object ({} when absent)."""
    params, scaling = cfg.get("rope_parameters") or {}, cfg.get("rope_scaling") or {}
    for p in (params, scaling):
        if not isinstance(p, dict):
            raise UserError(f"{family}: rope_parameters / rope_scaling must be an object, not {json_kind(p)}")
    return params, scaling


def rope(cfg: dict, family: str, theta: float = 10000.0, fraction: float = 1.0) -> tuple[float, float]:
    """(rope_theta, the rotated share of d_k) from transformers 5's rope_parameters or the older
    rope_theta / rope_scaling / partial_rotary_factor (GPT-NeoX: rotary_emb_base, rotary_pct).
    Only plain RoPE: any rope scaling is refused in one line."""
    params, scaling = rope_fields(cfg, family)
    kind = scaling.get("rope_type", scaling.get("type")) or params.get("rope_type") or "default"
    if kind != "default":
        raise UserError(f"{family} with rope_scaling {kind!r} is not supported (only plain RoPE)")
    theta = params.get("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", theta)))
    fraction = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", cfg.get("rotary_pct", fraction)))
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise UserError(f"{family}: the rotary share (rotary_pct / partial_rotary_factor) must be in (0, 1], "
                        f"got {fraction!r}")
    return float(theta), float(fraction)


# ---- sliding windows ------------------------------------------------------------------------------------

def window(cfg: dict, family: str, default: int | None = None) -> int | None:
    """config.json's sliding_window (default when it has none): a whole number >= 1, or null for none."""
    w = cfg.get("sliding_window", default)
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
        raise UserError(f"{family}: sliding_window must be a whole number >= 1 or null, got {w!r}")
    return w


def layer_types(cfg: dict, family: str, default: Callable[[int], list[str]]) -> list[str]:
    """config.json's layer_types, one of 'full_attention' / 'sliding_attention' per layer, or
    default(num_hidden_layers) for a config written before transformers listed them."""
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        types = default(n)
    if not isinstance(types, list) or len(types) != n:
        raise UserError(f"{family}: layer_types must list one kind per layer ({n}), got {types!r}")
    unknown = sorted({str(t) for t in types} - {"sliding_attention", "full_attention"})
    if unknown:
        raise UserError(f"{family}: layer type {unknown[0]!r} is not supported (only sliding_attention and "
                        "full_attention)")
    return types


def layer_windows(types: list[str], w: int | None) -> list:
    """Each layer's window: w on the 'sliding_attention' layers, None (every token before) on the others."""
    return [w if t == "sliding_attention" and w else None for t in types]
