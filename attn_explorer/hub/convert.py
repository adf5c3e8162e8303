"""Generic checkpoint conversion, for every row of hub/families: pick the row for a config.json,
translate and check its config, tie or find the LM head, and map the checkpoint's tensors onto our
names strictly (every key used or knowingly ignored, every shape checked)."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from attn_explorer.errors import UserError
from attn_explorer.hub.families import ARCHITECTURES, Architecture
from attn_explorer.hub.families.common import NOT_YET, check_config, json_kind  # noqa: F401 (check_config re-exported)

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
        raise UserError(f"{where}: the stored config must be a JSON object, not {json_kind(stored)}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(stored) - known)
    if unknown:
        raise UserError(f"{where}: unknown config field {unknown[0]!r} for {cls.__name__} (saved by a newer version?)")
    return check_config(cls(**stored), where)


def _kind(arch: Architecture) -> str:
    """Which group a row is listed under in `supported`: from what its model is, not where its row lives."""
    if arch.modality != "text" or getattr(arch.build, "text_encoder", False):  # CLIP's text tower with CLIP
        return "vision and image-text"
    if getattr(arch.build, "encoder_decoder", False):
        return "encoder-decoders"
    return "text decoders" if getattr(arch.build, "causal", False) else "text encoders"


def supported() -> str:
    """Every model_type we read, one line: sorted within its group ("text decoders: gemma2, llama, ...;
    text encoders: ...; encoder-decoders: ...; vision and image-text: ...")."""
    groups: dict[str, list[str]] = {k: [] for k in ("text decoders", "text encoders", "encoder-decoders",
                                                    "vision and image-text")}
    for mt, arch in ARCHITECTURES.items():
        groups.setdefault(_kind(arch), []).append(mt)
    return "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in groups.items() if v)


def architecture_for(cfg: dict, where: str) -> Architecture:
    if not isinstance(cfg, dict):
        raise UserError(f"{where}: config.json must be a JSON object {{\"model_type\": ...}}, not {json_kind(cfg)}")
    mt = cfg.get("model_type")
    if mt is None:
        raise UserError(f"{where}: config.json has no model_type; supported model types: {supported()}")
    if mt in NOT_YET and mt not in ARCHITECTURES:
        raise UserError(f"{where}: {mt} is not supported yet: {NOT_YET[mt]}")
    if mt not in ARCHITECTURES:
        raise UserError(f"{where}: unsupported architecture {mt!r} (config.json's model_type); supported model "
                        f"types: {supported()}")
    arch = ARCHITECTURES[mt]
    return arch if arch.variant is None else arch.variant(cfg)


def decoder_head(cfg: Any, hf: dict) -> dict:
    """A decoder's LM head, from its config and the tensors: tied (the embedding is the head; a stored
    copy, as some checkpoints carry, is dropped, as transformers ties it anyway), its own lm_head.weight,
    or none at all: a bare base model (LlamaModel, GPT2Model) saved untied has no head to read, and
    `cfg.head` becomes False (attention and hidden states, no generation). Returns the tensors to map.
    A config with `unread(key)` (Gemma 4) drops the tensors transformers leaves unread too."""
    unread = getattr(cfg, "unread", None)
    if unread is not None:  # Gemma 4: its KV-sharing layers' own k/v projections, stored but never used
        hf = {k: v for k, v in hf.items() if not unread(k)}
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
