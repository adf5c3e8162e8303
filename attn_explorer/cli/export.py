"""`export`: run a model on text or an image and save every head's attention as .npz, .json or .png.

Files are written to a temporary name beside the target and renamed into place, so a failed run
never leaves a half-written file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.files import MAX_TEXT_BYTES, atomic_write, check_output, read_text_file, result_arrays, save_npz
from attn_explorer.validate import MAX_DK_SCALE, dk_scale_value, finite_attention, positive_int

FORMATS = (".npz", ".json", ".png", ".html")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="built-in name, model folder, .safetensors file or hub id "
                   "(default: minilm for text, the default image model for images)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to run")
    src.add_argument("--text-file", help=f"read the text from this UTF-8 file (at most {MAX_TEXT_BYTES / 1e6:g} MB)")
    src.add_argument("--image", help="an image file")
    p.add_argument("--target", default=None, help="encoder-decoder models (BART): the decoder's text; --text is "
                   "the source. Adds encoder_attentions, decoder_attentions and cross_attentions to a .npz or .json")
    p.add_argument("--out", required=True, help="output file: .npz, .json, .png or .html (one self-contained page "
                   "to open in a browser: every head, one head, token focus, lines; maps stored as 8-bit)")
    p.add_argument("--dk-scale", default="1.0", help="multiply 1/sqrt(d_k) by this positive number, at most "
                   f"{MAX_DK_SCALE:g} (default 1)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16 (the CPU too)")
    p.add_argument("--max-tokens", default=None, help="keep only the first N tokens")
    p.add_argument("--image-size", default=None, help="square input side in pixels for image models")
    p.add_argument("--analysis", default=None, help="add analyses to a .npz or .json, comma-separated: "
                   f"{', '.join(EXPORT_ANALYSES)} (rollout: (L, N, N) through each layer; norms: (L, H, N, N) "
                   "value-weighted norms and (L, H, N) value norms; stats: (L, H) per-head statistics; relevance: "
                   "(M, N) each token's relevance by gradient rollout, AttnLRP (subset), rollout and raw attention)")
    p.add_argument("--relevance-target", default=None, help="with --analysis relevance: what is explained, the class "
                   "(images; default: the predicted one), the next token (decoders; default: the most likely) or a "
                   "reference sentence whose similarity is explained (encoders; needed)")


def save_result(r, out: str | os.PathLike, extra: dict[str, np.ndarray] | None = None) -> Path:
    """Save a RunResult as .npz, .json or .png (a picture of every head), atomically. `extra`: more named
    arrays (the analyses) for .npz and .json."""
    out = Path(out)
    ext = out.suffix.lower()
    if ext not in FORMATS:
        raise UserError(f"--out must end in {', '.join(FORMATS)}; got {out.name!r}")
    if extra and ext in (".png", ".html"):
        raise UserError("--analysis needs --out ending in .npz or .json")
    if ext == ".html":
        from attn_explorer.api.html import page_html

        page = page_html(r)  # before the temporary file: a refused run writes nothing

        def write_page(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(page)

        return atomic_write(out, write_page)
    if ext == ".npz" and extra:
        arrays = {**result_arrays(r), **extra}

        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez_compressed(f, **arrays)

        return atomic_write(out, write)
    if ext == ".npz":
        return save_npz(r, out)
    if ext == ".json":
        d = {k: v.tolist() for k, v in {**result_arrays(r, image=False), **(extra or {})}.items()}
        d["notes"] = list(r.notes)

        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(d, f)
    else:
        finite_attention(r.attentions)
        L, H, N, _ = r.attentions.shape
        title = (f"{r.model}: {L} layers x {H} heads, {N} tokens, dk_scale {r.dk_scale:g}; "
                 f"row i = where token i looks; colour 0..{float(r.attentions.max()):.2f} (viridis)")
        img = head_grid_image(r.attentions, title=title)

        def write(tmp):
            img.save(tmp, format="PNG")

    return atomic_write(out, write)


# ---- the all-heads picture ---------------------------------------------------------------------------

# viridis at 9 stops, interpolated to 256 entries: the GUI's default colormap, with no matplotlib.
_VIRIDIS = np.array([[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
                     [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]], dtype=np.float64)


def viridis_lut() -> np.ndarray:
    x = np.linspace(0, 1, len(_VIRIDIS))
    t = np.linspace(0, 1, 256)
    return np.stack([np.interp(t, x, _VIRIDIS[:, c]) for c in range(3)], axis=1).round().astype(np.uint8)


def head_grid_image(att: np.ndarray, cell: int | None = None, title: str = ""):
    """PIL image of an (L, H, N, N) stack: one heatmap per head, layers down, heads across, labelled.
    Colour runs from 0 to the largest weight (viridis); row i of each map is where token i looks."""
    from PIL import Image, ImageDraw

    L, H, N, _ = att.shape
    cell = cell or int(np.clip(1024 // max(H, 1), 48, 256))
    gap, margin, top = 4, 28, 28 + (20 if title else 0)
    W = margin + H * (cell + gap)
    Ht = top + L * (cell + gap)
    canvas = Image.new("RGB", (W, Ht), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((margin, 6), title, fill=(0, 0, 0))
    lut = viridis_lut()
    vmax = float(att.max()) or 1.0
    for li in range(L):
        for hi in range(H):
            idx = np.clip(att[li, hi] / vmax * 255, 0, 255).astype(np.uint8)
            tile = Image.fromarray(lut[idx]).resize((cell, cell), Image.Resampling.NEAREST)
            canvas.paste(tile, (margin + hi * (cell + gap), top + li * (cell + gap)))
    for hi in range(H):
        draw.text((margin + hi * (cell + gap) + cell // 2 - 8, top - 20), f"H{hi}", fill=(0, 0, 0))
    for li in range(L):
        draw.text((4, top + li * (cell + gap) + cell // 2 - 5), f"L{li}", fill=(0, 0, 0))
    return canvas


def run(args: argparse.Namespace) -> int:
    dk = dk_scale_value(args.dk_scale, "--dk-scale")
    max_tokens = None if args.max_tokens is None else positive_int(args.max_tokens, "--max-tokens")
    image_size = None if args.image_size is None else positive_int(args.image_size, "--image-size")
    out = Path(args.out)
    if out.suffix.lower() not in FORMATS:
        raise UserError(f"--out must end in {', '.join(FORMATS)}; got {out.name!r}")
    analyses = analysis_names(getattr(args, "analysis", None))
    if analyses and out.suffix.lower() in (".png", ".html"):
        raise UserError("--analysis needs --out ending in .npz or .json")
    if getattr(args, "relevance_target", None) is not None and "relevance" not in analyses:
        raise UserError("--relevance-target goes with --analysis relevance")
    target = getattr(args, "target", None)
    if target is not None and args.image is not None:
        raise UserError("--target goes with --text or --text-file (the source text), not --image")
    if target is not None and out.suffix.lower() in (".png", ".html"):
        raise UserError("--target needs --out ending in .npz or .json (it saves three stacks of maps)")
    check_output(out)  # before the model runs: a missing folder, or a folder or device named as --out
    text = read_text_file(args.text_file) if args.text_file is not None else args.text
    from attn_explorer.api.load import default_image_model, load_model

    if args.image is not None:
        if not Path(args.image).exists():
            raise UserError(f"image file not found: {args.image}")
        model = load_model(args.model or default_image_model(), device=args.device, dtype=args.dtype)
        if model.info.modality != "image":
            raise UserError(f"{model.info.name} is a text model; use --text or --text-file")
        x, kw = args.image, {"dk_scale": dk, "image_size": image_size}
    else:
        model = load_model(args.model or "minilm", device=args.device, dtype=args.dtype)
        if model.info.modality != "text":
            raise UserError(f"{model.info.name} is an image model; use --image")
        x, kw = text, {"dk_scale": dk, "max_tokens": max_tokens}
        if target is not None:
            if not model.info.encoder_decoder:
                raise UserError(f"--target needs an encoder-decoder model (BART); {model.info.name} has no decoder")
            kw["target"] = target
    r = model.run(x, **kw)
    for note in r.notes:
        print(f"note: {note}", file=sys.stderr)
    if not model.info.trained:
        print(f"note: {model.info.name} is untrained ({model.info.note})", file=sys.stderr)
    extra = analysis_arrays(model, r, x, {k: v for k, v in kw.items() if k != "target"}, analyses,
                            relevance_target=getattr(args, "relevance_target", None))
    if target is not None:
        extra.update(target_arrays(r))
    save_result(r, out, extra)
    L, H, N, _ = r.attentions.shape
    added = f"; with {', '.join(analyses)}" if analyses else ""
    print(f"wrote {out}: {L} layers x {H} heads x {N} tokens ({model.info.name}, dk_scale={dk:g}){added}")
    return 0


def target_arrays(r) -> dict[str, np.ndarray]:
    """An encoder-decoder run's maps under their own names: encoder_attentions (L, H, S, S), the decoder's
    causal decoder_attentions (L_dec, H, T, T) and cross_attentions (L_dec, H, T, S), and the tokens."""
    return {
        "encoder_attentions": np.ascontiguousarray(r.attentions, dtype=np.float32),
        "decoder_attentions": np.ascontiguousarray(r.decoder_attentions, dtype=np.float32),
        "cross_attentions": np.ascontiguousarray(r.cross_attentions, dtype=np.float32),
        "decoder_tokens": np.asarray(list(r.decoder_tokens), dtype=np.str_),
        "decoder_special": np.asarray(r.decoder_special, dtype=bool),
    }


# ---- --analysis: the analysis floor's arrays beside the attention ------------------------------------

EXPORT_ANALYSES = ("rollout", "norms", "stats", "relevance")


def analysis_names(text: str | None) -> list[str]:
    """"rollout,stats" -> ["rollout", "stats"]; an unknown name is one line."""
    if text is None:
        return []
    names = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    if not names:
        raise UserError(f"--analysis needs at least one of {', '.join(EXPORT_ANALYSES)}")
    for n in names:
        if n not in EXPORT_ANALYSES:
            raise UserError(f"unknown analysis {n!r}: choose from {', '.join(EXPORT_ANALYSES)}")
    return list(dict.fromkeys(names))


def analysis_arrays(model, r, x, run_kw: dict, names: list[str], relevance_target: str | None = None
                    ) -> dict[str, np.ndarray]:
    """The arrays each asked-for analysis adds (rollout and stats from r; norms from one more pass of model on x)."""
    out: dict[str, np.ndarray] = {}
    if "rollout" in names:
        from attn_explorer.analysis.rollout import rollout_layers

        out["rollout"] = rollout_layers(r.attentions)  # (L, N, N): through layers 0..l, heads averaged
    if "norms" in names:
        from attn_explorer.analysis.norms import model_norms

        kw = {k: v for k, v in run_kw.items() if v is not None}
        d = model_norms(model, x, None, **kw)
        out["norms"], out["value_norms"] = d.norms, d.value_norms
    if "stats" in names:
        from attn_explorer.analysis.stats import STATISTICS, head_stats

        patch = model.info.patch_size if r.grid is not None else None
        s = head_stats(r.attentions, r.special, r.grid, r.patch_offset, patch)
        for k in STATISTICS:
            out[f"stats_{k}"] = np.asarray(s.get(k), dtype=np.float64)
        out["stats_distance_unit"] = np.asarray(s.distance_unit, dtype=np.str_)
    if "relevance" in names:
        from attn_explorer.analysis.relevance import export_arrays

        out.update(export_arrays(model, x, run_kw, relevance_target))  # (M, N) and what each row explains
    return out
