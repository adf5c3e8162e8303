"""What every family row shares: the `Architecture` record, the one `ARCHITECTURES` table the family
modules append their rows to, and the readers of config.json fields that several families carry
(activations, optional widths, RoPE, sliding windows and layer types, norm epsilons). A family reads
these fields through here, never through its own copy, so one reader's fix reaches every family.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

from attn_explorer.core.positional import ROPE_KINDS, RopeScaling
from attn_explorer.errors import UserError

ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu",
        "quick_gelu": "quick_gelu"}
B = r"blocks.layers.\1."  # our block's name, with the HF layer number as group 1
# ---- the rename rules the Llama-style readers share (decoders, gemma, gpt_oss, llama4, olmo, glm_cohere, mamba)
L = r"layers\.(\d+)\."  # a Llama-style checkpoint's layer prefix, the HF layer number as group 1
QKV_RULES = [(L + rf"self_attn\.{hf}_proj\.(weight|bias)", B + rf"attn.{ours}.\2")
             for hf, ours in (("q", "query"), ("k", "key"), ("v", "value"))]
ATTENTION_RULES = QKV_RULES + [(L + r"self_attn\.o_proj\.(weight|bias)", B + r"attn.out.\2")]
EMBED_RULE = (r"embed_tokens\.weight", "embed_tokens.weight")
NORM1_RULE = (L + r"input_layernorm\.weight", B + r"norm1.weight")
HEAD_RULE = (r"lm_head\.weight", "lm_head.weight")  # untied only (see `decoder_head`)
FINAL_RULES = [(r"norm\.weight", "norm.weight"), HEAD_RULE]


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
    note: str = ""  # one line ModelInfo.note carries for every model of this row (Llama 4: no vision tower)
    # drop(our config, checkpoint key) -> True: a tensor left out given the config (DeepSeek-V3's multi-token-
    # prediction layers, numbered past num_hidden_layers)
    drop: Callable[[Any, str], bool] | None = None
    # variant(config.json) -> the row that reads it, where one model_type covers two kinds of checkpoint (gemma3:
    # with a vision tower, the vision-language row; without one, its language model)
    variant: Callable[[dict], "Architecture"] | None = None


# model_type -> its row; each module of hub/families appends its own (see families/__init__.py)
ARCHITECTURES: dict[str, Architecture] = {}
# model_type -> the one line a family known but not read yet is refused with (Qwen3-VL: what is missing)
NOT_YET: dict[str, str] = {}


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

LAYER_KINDS = ("full_attention", "sliding_attention")  # rope_parameters' keys when split by layer type


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


def rope_entry(cfg: dict, family: str, layer_kind: str = "full_attention") -> tuple[dict, bool]:
    """(the RoPE entry for layer_kind's layers, whether rope_parameters is split by layer type), as
    transformers reads it: the older rope_scaling, where set, stands in for rope_parameters; a
    rope_parameters keyed by layer type ({"full_attention": {...}, "sliding_attention": {...}}, Gemma 3)
    gives layer_kind's entry; a flat one serves every layer."""
    params, scaling = rope_fields(cfg, family)
    p = scaling or params
    nested = any(k in p for k in (*LAYER_KINDS, *(cfg.get("layer_types") or ())) if isinstance(k, str))
    if nested:
        p = p.get(layer_kind) or {}
        if not isinstance(p, dict):
            raise UserError(f"{family}: rope_parameters' {layer_kind} must be an object, not {json_kind(p)}")
    return dict(p), nested


def _number(p: dict, key: str, family: str, kind: str, default=None, low: float = 0.0, whole: bool = False):
    """p[key] (default when absent or null): a finite number >= low (a whole one if whole), refused in one line."""
    v = p.get(key)
    if v is None:
        if default is None:
            raise UserError(f"{family}: rope type {kind!r} needs {key} in rope_parameters / rope_scaling")
        return default
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= low
    if not ok or (whole and not isinstance(v, int)):
        raise UserError(f"{family}: rope {key} must be a {'whole' if whole else 'finite'} number >= {low:g}, "
                        f"got {v!r}")
    return v


def rope_scaling(cfg: dict, p: dict, family: str, rotary_dim: int, nested: bool = False,
                 aliases: dict[str, str] | None = None) -> RopeScaling:
    """The scaling of one RoPE entry p (see rope_entry), with transformers' defaults: llama3, yarn and
    longrope count from original_max_position_embeddings (Phi-3's top-level one first, else the entry's,
    else max_position_embeddings); dynamic from max_position_embeddings. An unknown type, or a field
    that is missing or not a number, is refused in one line. aliases: a family's old names (Phi-3's "su")."""
    kind = rope_kind(p)
    kind = (aliases or {}).get(kind, kind)
    if not isinstance(kind, str) or kind not in ROPE_KINDS:
        raise UserError(f"{family}: rope type {kind!r} is not supported (supported: {', '.join(ROPE_KINDS)})")
    if kind == "default":
        return RopeScaling()
    top = _number(cfg, "max_position_embeddings", family, kind, default=2048, low=1, whole=True)
    fields: dict = {"max_positions": top}
    if kind in ("llama3", "yarn", "longrope"):
        original = cfg.get("original_max_position_embeddings") if not nested else None
        fields["original_positions"] = _number({"o": original if original is not None else
                                                p.get("original_max_position_embeddings", top)},
                                               "o", family, kind, low=1, whole=True)
    if kind == "dynamic":
        fields["original_positions"] = top
    if kind in ("linear", "dynamic", "llama3"):
        fields["factor"] = _number(p, "factor", family, kind)
    elif kind == "yarn" and "factor" not in p:
        raise UserError(f"{family}: rope type 'yarn' needs factor in rope_parameters / rope_scaling")
    elif kind in ("yarn", "longrope", "proportional"):  # null: yarn and longrope take max / original
        fields["factor"] = None if p.get("factor") is None else _number(p, "factor", family, kind)
    if kind in ("yarn", "longrope") and p.get("attention_factor") is not None:
        fields["attention_factor"] = _number(p, "attention_factor", family, kind)
    if kind == "yarn":
        for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            if p.get(key) is not None:
                fields[key] = _number(p, key, family, kind, low=-math.inf)
        # transformers reads truncate from the top of rope_parameters, so a per-layer-type entry's is unseen
        fields["truncate"] = bool(p.get("truncate", True)) if not nested else True
    if kind == "llama3":
        fields.update(low_freq_factor=_number(p, "low_freq_factor", family, kind, low=-math.inf),
                      high_freq_factor=_number(p, "high_freq_factor", family, kind, low=-math.inf))
        if fields["high_freq_factor"] == fields["low_freq_factor"]:
            raise UserError(f"{family}: llama3 rope needs high_freq_factor > low_freq_factor")
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            v = p.get(key)
            if not isinstance(v, list) or len(v) != rotary_dim // 2 or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in v):
                raise UserError(f"{family}: longrope's {key} must list {rotary_dim // 2} positive numbers (one per "
                                f"rotated pair), got {v!r}")
            fields[key] = tuple(v)
    if kind == "proportional":
        fields["proportion"] = 1.0  # set by `rope` from the rotated share
    return RopeScaling(kind, **fields)


def rope(cfg: dict, family: str, head_dim: int, theta: float = 10000.0, fraction: float = 1.0,
         layer_kind: str = "full_attention", aliases: dict[str, str] | None = None) -> tuple[float, float, RopeScaling]:
    """(rope_theta, the rotated share of d_k, the frequency scaling) of layer_kind's layers, from
    transformers 5's rope_parameters (flat, or one entry per layer type) or the older rope_theta /
    rope_scaling / partial_rotary_factor (GPT-NeoX: rotary_emb_base, rotary_pct); theta and fraction
    are the family's defaults. Proportional RoPE turns the whole head, the share's frequencies only."""
    p, nested = rope_entry(cfg, family, layer_kind)
    theta = p.get("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", theta)))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        raise UserError(f"{family}: rope_theta must be a number > 0, got {theta!r}")
    fraction = p.get("partial_rotary_factor", cfg.get("partial_rotary_factor", cfg.get("rotary_pct", fraction)))
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise UserError(f"{family}: the rotary share (rotary_pct / partial_rotary_factor) must be in (0, 1], "
                        f"got {fraction!r}")
    proportional = rope_kind(p) == "proportional"
    scaling = rope_scaling(cfg, p, family, int(head_dim * (1.0 if proportional else fraction)), nested, aliases)
    if proportional:
        scaling = dataclasses.replace(scaling, proportion=fraction)
        fraction = 1.0
    return float(theta), float(fraction), scaling


def rope_positions(max_positions: int, scaling: RopeScaling) -> int:
    """How many positions a model may run: max_position_embeddings, which dynamic NTK scaling stretches
    by its factor (transformers sets no limit; the factor says how far the scaling was meant to reach)."""
    if scaling.kind == "dynamic" and scaling.factor > 1:
        return int(max_positions * scaling.factor)
    return max_positions


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


# every other int is a count or size >= 1; type_vocab_size 0: no token types (DistilBERT); token ids start at 0
_MAY_BE_ZERO = {"num_labels", "pad_token_id", "decoder_start_token_id", "position_offset", "type_vocab_size"}


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
