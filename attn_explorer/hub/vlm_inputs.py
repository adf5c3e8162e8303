"""A vision-language model's inputs as its own processor makes them: the tower's image preprocessing, and the
prompt with the image placeholder repeated once per image token.

- LLaVA (LlavaProcessor): each `<image>` in the prompt becomes `<image>` × image tokens (the patches, plus the
  class token under the "full" strategy); a prompt without one gets "<image>\\n" in front (the place llava-1.5's
  chat template gives it). The tokenizer then adds its own BOS.
- Idefics3 / SmolVLM (Idefics3Processor): a picture larger than one tile becomes rows × cols tiles plus a global
  view; each tile is `<fake_token_around_image><row_r_col_c>` + `<image>` × image tokens, a "\\n" after each row of
  tiles, then "\n<fake_token_around_image><global-img>" + `<image>` × image tokens + `<fake_token_around_image>`
  (a picture of one tile: the global part alone). A prompt without `<image>` gets the picture in front.
- Gemma 3 and LLaVA OneVision: `build_inputs` (the ids, pixels and image-token places in one; below).
- PaliGemma (PaliGemmaProcessor): `<image>` × image tokens, then BOS, the prompt and "\\n"; a prompt that holds
  `<image>` keeps it there and BOS goes after the last one. The whole prompt is the prefix (token type 0).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attn_explorer.errors import UserError
from attn_explorer.hub.images import ImagePreprocess

if TYPE_CHECKING:  # the fields' types only
    import numpy as np

IMAGE_TOKEN = "<image>"


@dataclass
class Expanded:
    text: str  # the prompt as the tokenizer reads it, the placeholder repeated
    add_special: bool  # whether the tokenizer's own BOS is added (PaliGemma writes its BOS into the text)
    note: str = ""


def vlm_parts(folder: Path, cfg) -> dict:
    """Model(...)'s extra parts for a vision-language folder: the tower's preprocessing; Idefics3 sets its
    tiling (cfg.longest_edge) from the processor's size.longest_edge (default: 4 tiles' width)."""
    pp_file = Path(folder) / "preprocessor_config.json"
    pp = json.loads(pp_file.read_text(encoding="utf-8")) if pp_file.exists() else None
    if cfg.kind in ("qwen2_5_vl", "qwen3_vl"):
        return qwen_parts(pp, cfg)
    if cfg.kind in ("gemma3", "llava_onevision"):
        return built_parts(pp, cfg)
    if cfg.kind == "idefics3":
        size = (pp or {}).get("size") or {}
        edge = size.get("longest_edge", 4 * cfg.vision.image_size) if isinstance(size, dict) else 4 * cfg.vision.image_size
        if isinstance(edge, bool) or not isinstance(edge, int) or edge < 1:
            raise UserError(f"idefics3: preprocessor_config.json's size.longest_edge must be a whole number >= 1, got {edge!r}")
        cfg.longest_edge = edge
        if not (pp or {}).get("do_image_splitting", True):
            cfg.longest_edge = cfg.vision.image_size
        resample = (pp or {}).get("resample", 1)
        return {"preprocess": ImagePreprocess(resize_to=(cfg.vision.image_size,) * 2, resample=resample,
                                              rescale=(pp or {}).get("rescale_factor", 1 / 255),
                                              mean=tuple((pp or {}).get("image_mean", (0.5,) * 3)),
                                              std=tuple((pp or {}).get("image_std", (0.5,) * 3)))}
    return {"preprocess": ImagePreprocess.from_config(pp, cfg.vision.image_size)}


FAKE, GLOBAL = "<fake_token_around_image>", "<global-img>"


def tiles_of(img, side: int, longest_edge: int, pp: ImagePreprocess):
    """Idefics3's views of a picture: resized so its longer side is longest_edge, each side then stretched up to
    whole tiles of side px; rows × cols tiles (row by row) and the whole picture at side × side last. One tile's
    worth or less: the picture alone at side × side (rows = cols = 0). Returns (pixels (T, 3, side, side),
    rows, cols, the uint8 picture the tiles cut)."""
    import math

    import numpy as np
    from PIL import Image

    w, h = img.size
    s = longest_edge / max(w, h)
    w, h = max(1, int(round(w * s))), max(1, int(round(h * s)))
    rows, cols = math.ceil(h / side), math.ceil(w / side)
    resample = Image.Resampling(pp.resample)
    one = ImagePreprocess(resize_to=(side, side), resample=pp.resample, rescale=pp.rescale, mean=pp.mean, std=pp.std)
    if rows * cols == 1:
        px, seen = one(img)
        return px[None], 0, 0, seen
    big = img.resize((cols * side, rows * side), resample)
    views = [big.crop((c * side, r * side, (c + 1) * side, (r + 1) * side)) for r in range(rows) for c in range(cols)]
    views.append(img.resize((w, h), resample))  # the global view: the picture at the longest edge, then side × side
    return np.stack([one(v)[0] for v in views]), rows, cols, np.asarray(big, dtype=np.uint8).copy()


def idefics3_block(rows: int, cols: int, image_tokens: int) -> str:
    """The text Idefics3's processor puts in place of one `<image>`."""
    block = IMAGE_TOKEN * image_tokens
    whole = FAKE + GLOBAL + block + FAKE
    if rows == cols == 0:
        return whole
    grid = "".join("".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>{block}" for c in range(cols)) + "\n" for r in range(rows))
    return grid + "\n" + whole


def expand_prompt(kind: str, prompt: str, image_tokens: int, images: int, bos: str | None,
                  tiles: tuple[int, int] = (0, 0)) -> Expanded:
    """The prompt with each image placeholder repeated image_tokens times, as kind's processor expands it
    (Idefics3: tiles = (rows, cols) of the picture, image_tokens per view)."""
    found = prompt.count(IMAGE_TOKEN)
    if found > images:
        raise UserError(f"the prompt holds {found} {IMAGE_TOKEN} placeholders for {images} image"
                        f"{'s' if images != 1 else ''}: give one {IMAGE_TOKEN} per image, or none")
    block = IMAGE_TOKEN * image_tokens
    if kind == "idefics3":
        block = idefics3_block(*tiles, image_tokens)
        if found:
            return Expanded(prompt.replace(IMAGE_TOKEN, block), True)
        return Expanded(block + prompt, True, "no <image> in the prompt: the picture goes first")
    if kind == "paligemma":
        if found:
            end = prompt.rfind(IMAGE_TOKEN) + len(IMAGE_TOKEN)
            text = prompt[:end].replace(IMAGE_TOKEN, block) + (bos or "") + prompt[end:] + "\n"
            return Expanded(text, False)
        return Expanded(block + (bos or "") + prompt + "\n", False,
                        "the picture's tokens go first, then the prompt (as PaliGemma's processor puts them)")
    if found:
        return Expanded(prompt.replace(IMAGE_TOKEN, block), True)
    return Expanded(block + "\n" + prompt, True,
                    f"no {IMAGE_TOKEN} in the prompt: the picture goes first, as llava-1.5's chat template puts it")


# Qwen2.5-VL (Qwen2VLImageProcessor, Qwen2_5_VLProcessor): the picture at its own resolution, each side a multiple
# of patch × merge px, the area within [min_pixels, max_pixels]; the prompt's image becomes
# <|vision_start|> + <|image_pad|> × image tokens + <|vision_end|>.
QWEN_PAD, QWEN_START, QWEN_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The processor's size: each side rounded to a multiple of factor, then scaled (keeping the aspect) into the
    pixel bounds; an aspect ratio over 200 is refused."""
    import math

    if max(height, width) / min(height, width) > 200:
        raise UserError(f"qwen2_5_vl: the picture's aspect ratio must be under 200, got "
                        f"{max(height, width) / min(height, width):.0f}")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def qwen_parts(pp: dict | None, cfg) -> dict:
    """The preprocessing of preprocessor_config.json (min/max pixels into cfg) for Qwen2.5-VL."""
    pp = pp or {}
    size = pp.get("size") if isinstance(pp.get("size"), dict) else {}
    lo = pp.get("min_pixels", size.get("shortest_edge", size.get("min_pixels", 56 * 56)))
    hi = pp.get("max_pixels", size.get("longest_edge", size.get("max_pixels", 28 * 28 * 1280)))
    for name, v in (("min_pixels", lo), ("max_pixels", hi)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"qwen2_5_vl: preprocessor_config.json's {name} must be a whole number >= 1, got {v!r}")
    cfg.min_pixels, cfg.max_pixels = lo, hi
    return {"preprocess": ImagePreprocess(resample=pp.get("resample", 3), rescale=pp.get("rescale_factor", 1 / 255),
                                          mean=tuple(pp.get("image_mean", CLIP_MEAN)),
                                          std=tuple(pp.get("image_std", CLIP_STD)))}


def qwen_patches(img, vision, min_pixels: int, max_pixels: int, pp: ImagePreprocess):
    """(patches float32 (P, C·T·p·p) in the processor's merge-block-major order, grid (1, rows, cols) in
    patches, the uint8 picture seen)."""
    import numpy as np

    p, m, T = vision.patch_size, vision.merge, vision.temporal_patch_size
    w, h = img.size
    H, W = smart_resize(h, w, p * m, min_pixels, max_pixels)
    one = ImagePreprocess(resize_to=(H, W), resample=pp.resample, rescale=pp.rescale, mean=pp.mean, std=pp.std)
    x, seen = one(img)  # (C, H, W)
    C, gh, gw = x.shape[0], H // p, W // p
    x = x.reshape(C, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # (R, Cm, m, m, C, p, p)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], T, p, p))
    return np.ascontiguousarray(x.reshape(gh * gw, C * T * p * p), dtype=np.float32), (1, gh, gw), seen


def qwen_prompt(prompt: str, image_tokens: int) -> Expanded:
    """The prompt with its image as Qwen2.5-VL's processor writes it: a <|image_pad|> (inside
    <|vision_start|>…<|vision_end|>, as the chat template writes it) repeated image_tokens times, or an `<image>`
    replaced by the whole block; a prompt with neither gets the block in front."""
    block = QWEN_START + QWEN_PAD * image_tokens + QWEN_END
    pads, tags = prompt.count(QWEN_PAD), prompt.count(IMAGE_TOKEN)
    if pads + tags > 1:
        raise UserError(f"the prompt holds {pads + tags} image placeholders for 1 image: give one {QWEN_PAD} (or "
                        f"{IMAGE_TOKEN}), or none")
    if pads:
        return Expanded(prompt.replace(QWEN_PAD, QWEN_PAD * image_tokens), False)
    if tags:
        return Expanded(prompt.replace(IMAGE_TOKEN, block), False)
    return Expanded(block + prompt, False, "no image placeholder in the prompt: the picture goes first")


# Gemma 3 (Gemma3Processor) and LLaVA OneVision (LlavaOnevisionProcessor): the ids, the pixels and each image
# token's place built together (api.vlm turns them into the run's inputs).
GEMMA_BOI, GEMMA_EOI, GEMMA_PAD = "<start_of_image>", "<end_of_image>", "<image_soft_token>"


@dataclass
class VLMInputs:
    ids: list  # the prompt's token ids, the picture's placeholders expanded
    pixels: "np.ndarray"  # float32 (views, C, H, W)
    positions: "np.ndarray"  # int32 (image tokens, 5): token, tile, row, col, merge (row, col -1: a newline token)
    tokens: list  # the tokens as shown, image tokens labelled
    special: list
    notes: list
    seen: "np.ndarray"  # uint8 (H, W, 3): the picture as the first view holds it
    extra: dict  # the module's other inputs (image_size)


def built_parts(pp: dict | None, cfg) -> dict:
    """The preprocessing of preprocessor_config.json for Gemma 3 (a plain resize to the tower's size; pan-and-scan
    crops refused) and LLaVA OneVision (its tiles' resample, mean and std; the same pinpoints as config.json)."""
    pp = pp or {}
    side = cfg.vision.image_size
    if cfg.kind == "gemma3":
        if pp.get("do_pan_and_scan"):
            raise UserError("gemma3: preprocessor_config.json's do_pan_and_scan (extra crops of the picture) is not "
                            "supported yet")
        return {"preprocess": ImagePreprocess(resize_to=(side, side), resample=pp.get("resample", 2),
                                              rescale=pp.get("rescale_factor", 1 / 255),
                                              mean=tuple(pp.get("image_mean", (0.5,) * 3)),
                                              std=tuple(pp.get("image_std", (0.5,) * 3)))}
    pins = pp.get("image_grid_pinpoints")
    if pins is not None and [list(p) for p in pins] != cfg.grid_pinpoints:
        raise UserError("llava_onevision: preprocessor_config.json's image_grid_pinpoints differ from config.json's "
                        "(the picture would be cut on one canvas and read back on another)")
    return {"preprocess": ImagePreprocess(resize_to=(side, side), resample=pp.get("resample", 3),
                                          rescale=pp.get("rescale_factor", 1 / 255),
                                          mean=tuple(pp.get("image_mean", CLIP_MEAN)),
                                          std=tuple(pp.get("image_std", CLIP_STD)))}


def anyres_views(img, cfg, pp: ImagePreprocess):
    """LLaVA OneVision's views of a picture: the whole picture at the tower's size, then the picture resized into
    its best canvas (keeping its shape), padded with black to it and cut into tiles row by row. Returns (pixels
    (1 + tiles, 3, S, S), the layout (core.vlm_connectors.AnyresLayout), the uint8 base view)."""
    import math

    import numpy as np
    from PIL import Image

    from attn_explorer.core.vlm_connectors import anyres_layout

    v = cfg.vision
    S = v.image_size
    w, h = img.size
    layout = anyres_layout((h, w), cfg.grid_pinpoints, S, v.native_grid, cfg.max_tiles)
    rows, cols = layout.tiles
    th, tw = rows * S, cols * S
    if tw / w < th / h:
        nw, nh = tw, min(math.ceil(h * tw / w), th)
    else:
        nw, nh = min(math.ceil(w * th / h), tw), th
    canvas = Image.new("RGB", (tw, th))
    canvas.paste(img.resize((nw, nh), Image.Resampling(pp.resample)), ((tw - nw) // 2, (th - nh) // 2))
    base, seen = pp(img)
    tiles = [pp(canvas.crop((c * S, r * S, (c + 1) * S, (r + 1) * S)))[0] for r in range(rows) for c in range(cols)]
    return np.stack([base, *tiles]), layout, seen


def gemma3_prompt(prompt: str, image_tokens: int) -> Expanded:
    """Gemma3Processor's expansion: its placeholder <start_of_image> (or an `<image>`) becomes "\n\n<start_of_image>"
    + <image_soft_token> × image tokens + "<end_of_image>\n\n"; a prompt with neither gets that block in front
    (where the chat template puts the picture, at the start of the user's turn). The tokenizer adds its BOS."""
    block = "\n\n" + GEMMA_BOI + GEMMA_PAD * image_tokens + GEMMA_EOI + "\n\n"
    found = prompt.count(GEMMA_BOI) + prompt.count(IMAGE_TOKEN)
    if found > 1:
        raise UserError(f"the prompt holds {found} image placeholders for 1 image: give one {GEMMA_BOI} (or "
                        f"{IMAGE_TOKEN}), or none")
    if found:
        return Expanded(prompt.replace(GEMMA_BOI, block).replace(IMAGE_TOKEN, block), True)
    return Expanded(block + prompt, True, "no image placeholder in the prompt: the picture goes first")


def build_inputs(cfg, img, text: str, tok, pp: ImagePreprocess, family: str, max_positions: int) -> VLMInputs:
    """Gemma 3's or LLaVA OneVision's inputs for a picture (RGB PIL image) and a prompt, as their processors
    make them. Views: (tile, rows, cols, merge, a newline token after each row) in the image tokens' order.
    OneVision's tile 0 is the canvas (the picture's tiles as one grid, the padding cut: it lies on the picture, so
    the overlay draws it there), tile 1 the base view (the whole picture at the tower's size), though the base view's
    tokens come first in the prompt."""
    import numpy as np

    if tok is None:
        raise UserError(f"{family}: the folder has no tokenizer (tokenizer.json); it cannot read a prompt")
    pad = GEMMA_PAD if cfg.kind == "gemma3" else IMAGE_TOKEN
    if tok.tok.token_to_id(pad) != cfg.image_token_id:
        raise UserError(f"{family}: the tokenizer has no {pad} token with id {cfg.image_token_id} "
                        "(image_token_index in config.json)")
    notes = []
    if cfg.kind == "gemma3":
        for name, want in ((GEMMA_BOI, cfg.boi_token_id), (GEMMA_EOI, cfg.eoi_token_id)):
            if tok.tok.token_to_id(name) != want:
                raise UserError(f"{family}: the tokenizer has no {name} token with id {want} (config.json's "
                                f"{'boi' if name == GEMMA_BOI else 'eoi'}_token_index)")
        px, seen = pp(img)
        pixels, side = px[None], cfg.vision.native_grid // cfg.pool
        views = [(0, side, side, cfg.pool, False)]
        ex = gemma3_prompt(text, side * side)
        notes.append(pp.crop_note(img.size))
    else:
        pixels, layout, seen = anyres_views(img, cfg, pp)
        g = cfg.vision.native_grid
        views = [(1, g, g, 1, False), (0, *layout.out, 1, True)]  # the canvas is tile 0: it lies on the picture
        ex = expand_prompt("llava", text, g * g + layout.tokens, 1, None)
        if ex.note:
            ex.note = (f"no {IMAGE_TOKEN} in the prompt: the picture goes first, as LLaVA OneVision's chat template "
                       "puts it")
        notes.append(f"the picture read as a {g} × {g} base view and {layout.tiles[0]} × {layout.tiles[1]} tiles "
                     f"({layout.out[0]} × {layout.out[1]} image tokens after the padding is cut)")
    enc = tok.tok.encode(ex.text, add_special_tokens=ex.add_special)
    ids = list(enc.ids)
    n_image = sum(r * (c + nl) for _t, r, c, _m, nl in views)
    if len(ids) > max_positions:
        raise UserError(f"{family}: {len(ids)} tokens (the picture's {n_image} and the prompt's) are more than the "
                        f"model's {max_positions} positions")
    place = [i for i, t in enumerate(ids) if t == cfg.image_token_id]
    if len(place) != n_image:
        raise UserError(f"{family}: the prompt already holds {len(place) - n_image} image tokens of its own")
    # (tile, row, col, merge) per image token; a row's newline token has no place (-1, -1): it is named by its row
    spots = [(t, r, c, m) for t, R, C, m, nl in views for r in range(R) for c in [*range(C), *([-1] if nl else [])]]
    pos = np.array([(i, t, r if c >= 0 else -1, c, m) for i, (t, r, c, m) in zip(place, spots)],
                   dtype=np.int32).reshape(-1, 5)
    tokens = tok.display(ids)
    for i, (t, r, c, _m) in zip(place, spots):
        where = "global " if cfg.kind == "llava_onevision" and t == 1 else ""
        tokens[i] = f"<image {where}r{r}c{c}>" if c >= 0 else f"<image newline r{r}>"
    image = set(place)
    special = [bool(s) and i not in image for i, s in enumerate(enc.special_tokens_mask)]
    extra = {"image_size": (img.size[1], img.size[0])} if cfg.kind == "llava_onevision" else {}
    return VLMInputs(ids, pixels, pos, tokens, special, [n for n in notes + [ex.note] if n], seen, extra)
