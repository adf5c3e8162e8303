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
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", help="the text to run (with --image: a vision-language model's prompt)")
    src.add_argument("--text-file", help=f"read the text from this UTF-8 file (at most {MAX_TEXT_BYTES / 1e6:g} MB)")
    p.add_argument("--image", help="an image file (with --text for a vision-language model: LLaVA, PaliGemma)")
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
                   "(M, N) each token's relevance by gradient rollout, AttnLRP (subset), rollout and raw attention), "
                   "or the name of your own analysis (ax.register_analysis, or a package's attn_explorer.analyses "
                   "entry point), saved as analysis_NAME. Vision-language models (--image and --text): rollout, "
                   "stats, relevance and your own, over the decoder's image and text tokens")
    p.add_argument("--relevance-target", default=None, help="with --analysis relevance: what is explained, the class "
                   "(images; default: the predicted one), the next token (decoders; default: the most likely) or a "
                   "reference sentence whose similarity is explained (encoders; needed)")
    p.add_argument("--layers", default=None, help="only these layers, comma-separated (e.g. 0,5; default: all)")
    p.add_argument("--heads", default=None, help="only these heads of each chosen layer, comma-separated (default: all)")
    p.add_argument("--pool", default=None, help="max-pool each chosen head to at most N x N cells (long inputs: "
                   "a run of any length keeps q and k and computes just these)")


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

def viridis_lut() -> np.ndarray:
    """(256, 3) uint8 viridis, the GUI's default colormap, with no matplotlib (written once, in api.notebook)."""
    from attn_explorer.api.notebook import viridis_lut as lut

    return lut()


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
    chosen = head_choice(args, out)  # --layers/--heads/--pool: checked before the model loads
    check_output(out)  # before the model runs: a missing folder, or a folder or device named as --out
    text = read_text_file(args.text_file) if args.text_file is not None else args.text
    from attn_explorer.api.load import default_image_model, load_model

    if args.image is None and text is None:
        raise UserError("give --text, --text-file or --image (a vision-language model: --image and --text); "
                        "see attn-explorer export --help")
    if args.image is not None:
        if not Path(args.image).exists():
            raise UserError(f"image file not found: {args.image}")
        model = load_model(args.model or default_image_model(), device=args.device, dtype=args.dtype)
        if model.info.modality == "text":
            raise UserError(f"{model.info.name} is a text model: it reads no image; drop --image")
        if model.info.modality == "image" and text is not None:
            raise UserError(f"{model.info.name} is an image model: it reads no prompt; drop --text")
        x, kw = args.image, {"dk_scale": dk, "image_size": image_size}
        if model.info.modality == "image-text":  # issue 26: the decoder's maps, the tower's and the image tokens'
            if chosen is not None:
                raise UserError(f"{model.info.name}: --layers, --heads and --pool are not supported yet "
                                "for vision-language models")
            if "norms" in analyses:  # before the run: api.vlm's trace serves interventions and relevance only
                raise UserError(f"{model.info.name}: --analysis norms is not supported yet for vision-language "
                                "models (rollout, stats, relevance and your own analyses are)")
            kw = {"dk_scale": dk, "text": text, **({"image_size": image_size} if image_size else {}),
                  **({"max_tokens": max_tokens} if max_tokens else {})}
    else:
        model = load_model(args.model or "minilm", device=args.device, dtype=args.dtype)
        if model.info.modality == "image-text":
            raise UserError(f"{model.info.name} is a vision-language model: give it --image (and --text)")
        if model.info.modality != "text":
            raise UserError(f"{model.info.name} is an image model; use --image")
        x, kw = text, {"dk_scale": dk, "max_tokens": max_tokens}
        if target is not None:
            if not model.info.encoder_decoder:
                raise UserError(f"--target needs an encoder-decoder model (BART); {model.info.name} has no decoder")
            kw["target"] = target
    check_choice(chosen, model.info)
    r = model.run(x, **kw)
    if model.info.modality == "image-text":  # the analyses run the model again on the pair, as analyses take it
        x_an, kw_an = (x, text), {"dk_scale": dk}
    else:
        x_an, kw_an = x, {k: v for k, v in kw.items() if k != "target"}
    extra = analysis_arrays(model, r, x_an, kw_an, analyses, relevance_target=getattr(args, "relevance_target", None))
    for note in r.notes:  # after the analyses: one that refuses is one line on its own
        print(f"note: {note}", file=sys.stderr)
    if not model.info.trained:
        print(f"note: {model.info.name} is untrained ({model.info.note})", file=sys.stderr)
    if target is not None:
        extra.update(target_arrays(r))
    if getattr(r, "image_token_positions", None) is not None:  # vision-language: the tower's maps, the image tokens
        extra.update(vision_attentions=r.vision_attentions, image_token_positions=r.image_token_positions,
                     image_token_columns=np.asarray(["token", "tile", "row", "col", "merge"], dtype=np.str_))
    if chosen is not None or r.is_lazy:
        return save_chosen_heads(r, out, chosen, extra)
    save_result(r, out, extra)
    L, H, N, _ = r.attentions.shape
    added = f"; with {', '.join(analyses)}" if analyses else ""
    print(f"wrote {out}: {L} layers x {H} heads x {N} tokens ({model.info.name}, dk_scale={dk:g}){added}")
    return 0


# ---- --layers / --heads / --pool: chosen heads, at full resolution or pooled (any input length) --------

def _index_list(text: str, flag: str) -> list[int]:
    """"0,5" -> [0, 5]: non-negative whole numbers, each once, in the order given; anything else is one line."""
    parts = [t.strip() for t in str(text).split(",")]
    if not parts or any(not t.isdigit() for t in parts):
        raise UserError(f"{flag} takes whole numbers from 0, comma-separated (e.g. {flag} 0,5); got {text!r}")
    return list(dict.fromkeys(int(t) for t in parts))


def head_choice(args, out: Path) -> dict | None:
    """What --layers, --heads and --pool ask for ({"layers", "heads", "pool"}; None when none is given)."""
    layers, heads, pool = (getattr(args, a, None) for a in ("layers", "heads", "pool"))
    if layers is None and heads is None and pool is None:
        return None
    if out.suffix.lower() not in (".npz", ".json"):
        raise UserError("--layers, --heads and --pool need --out ending in .npz or .json")
    if getattr(args, "target", None) is not None:
        raise UserError("--layers, --heads and --pool are not supported yet with --target (encoder-decoders)")
    return {"layers": None if layers is None else _index_list(layers, "--layers"),
            "heads": None if heads is None else _index_list(heads, "--heads"),
            "pool": None if pool is None else positive_int(pool, "--pool")}


def check_choice(chosen: dict | None, info) -> None:
    """A chosen layer or head the model does not have is one line, before the model runs."""
    for what, got, top in (("layer", (chosen or {}).get("layers"), info.num_layers),
                           ("head", (chosen or {}).get("heads"), info.num_heads)):
        bad = [i for i in (got or []) if i >= top]
        if bad:
            raise UserError(f"no {what} {bad[0]}: {info.name} has {what}s 0..{top - 1}")


def chosen_arrays(r, chosen: dict | None) -> dict[str, np.ndarray]:
    """The chosen heads of r as arrays: attentions (layers, heads, rows, cols) float32 (pooled by max to at
    most pool × pool cells, or at full resolution), the layer and head numbers, pool (0: full resolution),
    and the run's tokens. Works for lazy runs (each head computed from q and k, one at a time)."""
    from attn_explorer.budget import default_budget, human_bytes

    chosen = chosen or {"layers": None, "heads": None, "pool": None}
    L, H, N, M = r.attentions.shape
    layers = chosen["layers"] if chosen["layers"] is not None else list(range(L))
    heads = chosen["heads"] if chosen["heads"] is not None else list(range(H))
    for what, got, top in (("layer", layers, L), ("head", heads, H)):
        bad = [i for i in got if i >= top]
        if bad:
            raise UserError(f"no {what} {bad[0]}: {r.model} has {what}s 0..{top - 1}")
    pool = chosen["pool"]
    rows, cols = (N, M) if pool is None else (min(N, pool), min(M, pool))
    need = len(layers) * len(heads) * rows * cols * 4
    if pool is None and r.is_lazy and need > min(default_budget("cpu"), 2 * 10**9):
        raise UserError(f"{len(layers)} x {len(heads)} heads of {N:,} tokens at full resolution would be "
                        f"{human_bytes(need)}: choose fewer with --layers/--heads, or add --pool 1024")
    stack = np.empty((len(layers), len(heads), rows, cols), dtype=np.float32)
    for a, layer in enumerate(layers):
        for b, head in enumerate(heads):
            stack[a, b] = r.attention(layer, head, pool=pool)
    d = {"attentions": finite_attention(stack), "layers": np.asarray(layers, dtype=np.int64),
         "heads": np.asarray(heads, dtype=np.int64), "pool": np.asarray(pool or 0, dtype=np.int64),
         "tokens": np.asarray(list(r.tokens), dtype=np.str_), "special": np.asarray(r.special, dtype=bool),
         "model": np.asarray(str(r.model), dtype=np.str_), "dk_scale": np.asarray(float(r.dk_scale))}
    if r.grid is not None:
        d["grid"] = np.asarray(r.grid, dtype=np.int64)
    if getattr(r, "sinks", None) is not None:  # gpt-oss: the chosen heads' sink share of every row (unpooled)
        d["sinks"] = np.ascontiguousarray(r.sinks[np.ix_(layers, heads)], dtype=np.float32)
    if getattr(r, "routing", None) is not None:  # MoE: the chosen layers' routing (len(layers), N, k)
        d.update({k: v[layers] if v.ndim == 3 else v for k, v in r.routing.arrays().items()})
    return d


def save_chosen_heads(r, out: Path, chosen: dict | None, extra: dict | None = None) -> int:
    """Write the chosen heads (chosen_arrays, with any analyses' arrays) to .npz or .json, atomically. A lazy
    run without a choice has no maps to write whole: that is one line naming the flags."""
    if out.suffix.lower() not in (".npz", ".json"):
        raise UserError(f"this {r.num_tokens:,}-token run kept no maps to draw: write chosen heads to .npz or "
                        ".json with --layers/--heads and --pool 1024")
    if chosen is None:
        raise UserError(f"this {r.num_tokens:,}-token run kept no maps (they would need "
                        f"{r.attentions.dense_bytes / 1e9:.3g} GB): choose heads with --layers 0,5 --heads 2, "
                        "or pool them with --pool 1024")
    arrays = {**chosen_arrays(r, chosen), **(extra or {})}
    if out.suffix.lower() == ".npz":
        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez_compressed(f, **arrays)
    else:
        d = {k: v.tolist() for k, v in arrays.items()}
        d["notes"] = list(r.notes)

        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(d, f)
    atomic_write(out, write)
    a = arrays["attentions"]
    how = f"pooled to {a.shape[2]} x {a.shape[3]}" if chosen["pool"] else "full resolution"
    print(f"wrote {out}: {a.shape[0]} layers x {a.shape[1]} heads x {r.num_tokens} tokens, {how} "
          f"({r.model}, dk_scale={r.dk_scale:g})")
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
    """"rollout,stats" -> ["rollout", "stats"]; the built-in names in any case, a registered analysis's
    (ax.register_analysis, or an installed entry point) as it was registered; an unknown name is one line."""
    if text is None:
        return []
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise UserError(f"--analysis needs at least one of {', '.join(EXPORT_ANALYSES)}")
    out, notes = [], []
    for n in names:
        if n.lower() in EXPORT_ANALYSES:
            out.append(n.lower())
            continue
        from attn_explorer.api.analyses import analyses, problems

        mine, notes = analyses(), problems()
        if n not in mine:
            broken = [p for p in notes if p.startswith(f"analysis {n!r} ")]
            if broken:  # an installed analysis that could not be loaded: its own line
                raise UserError(broken[0])
            yours = f"; registered: {', '.join(mine)}" if mine else ""
            raise UserError(f"unknown analysis {n!r}: choose from {', '.join(EXPORT_ANALYSES)}{yours}")
        out.append(n)
    for p in notes:  # installed analyses that could not be loaded, when one of yours is asked for
        print(f"note: {p}", file=sys.stderr)
    return list(dict.fromkeys(out))


def custom_arrays(r, names: list[str]) -> dict[str, np.ndarray]:
    """Each registered analysis asked for, run on r and checked, saved as analysis_NAME."""
    from attn_explorer.api.analyses import analyses, run_analysis

    mine = set(analyses())
    return {f"analysis_{n}": np.asarray(run_analysis(n, r).values) for n in names if n in mine
            and n not in EXPORT_ANALYSES}


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

        # a vision-language run's r.grid is its tower's: the decoder's maps are over tokens, so distances are too
        grid = None if getattr(r, "image_token_positions", None) is not None else r.grid
        patch = model.info.patch_size if grid is not None else None
        s = head_stats(r.attentions, r.special, grid, r.patch_offset if grid is not None else 0, patch)
        for k in STATISTICS:
            out[f"stats_{k}"] = np.asarray(s.get(k), dtype=np.float64)
        out["stats_distance_unit"] = np.asarray(s.distance_unit, dtype=np.str_)
    if "relevance" in names:
        from attn_explorer.analysis.relevance import export_arrays

        out.update(export_arrays(model, x, run_kw, relevance_target))  # (M, N) and what each row explains
    out.update(custom_arrays(r, names))  # your own analyses: fn(r) -> array, checked
    return out
