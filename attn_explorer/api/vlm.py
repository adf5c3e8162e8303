"""`VisionLanguageModel`: a Model whose input is a picture and a prompt (LLaVA, PaliGemma; core.vlm).

    r = m.run("cat.png", text="<image>\\nWhat is this?")
    r.attentions               # (L, H, N, N): the decoder's maps over every token, image and text
    r.vision_attentions        # (T, L_v, H_v, P, P): the tower's own maps, per tile
    r.image_token_positions    # int32 (n, 5): token index, tile, row, col, merge of each image token
    r.tokens                   # image tokens read "<image r3c5>" (tile prefix "t1 " where there are tiles)

The prompt's `<image>` is expanded as the model's own processor expands it (hub.vlm_inputs); a prompt without
one gets the picture where the processor or chat template puts it (a note says so). lazy=True keeps the
decoder's q, k and row statistics (the tower's maps too where they are no larger). Prefix reuse and
encoder-decoder targets are refused in one line; hooks (run_with_hooks, run_with_cache), ablation and
`with m.hooks(...)` reach the decoder's blocks, in the order Model.trace gives them. Relevance
(analysis.relevance_vlm) and interventions (on the pair (image, text)) trace these models inside `analysis(...)`.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from attn_explorer.api.hooks import ablation_hooks
from attn_explorer.api.lazy import module_kept_bytes
from attn_explorer.api.model import DENSE_MAX_BYTES, Model, Prepared
from attn_explorer.budget import default_budget, human_bytes
from attn_explorer.api.result import RunResult
from attn_explorer.core.hooks import Hooks
from attn_explorer.errors import UserError
from attn_explorer.hub.images import open_image
from attn_explorer.hub.vlm_inputs import (IMAGE_TOKEN, QWEN_PAD, build_inputs, expand_prompt, qwen_patches,
                                          qwen_prompt, tiles_of)
from attn_explorer.validate import text_size_ok

POSITION_COLUMNS = ("token", "tile", "row", "col", "merge")  # image_token_positions' columns
_ANALYSIS: ContextVar = ContextVar("vlm_analysis", default=None)  # the analysis now tracing (see `analysis`)


@contextmanager
def analysis(name: str):
    """Open VisionLanguageModel.trace to the analysis `name` inside the block: the analyses that have been
    checked on these models (interventions, relevance) run their forwards in one; others stay refused."""
    token = _ANALYSIS.set(name)
    try:
        yield
    finally:
        _ANALYSIS.reset(token)


@dataclass
class Generated:
    """Greedy generation after a picture and a prompt: the new ids and tokens, and each step's attention row
    (L, H, tokens so far) of the newest token over every earlier token, image and text."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    image_token_positions: np.ndarray | None = None


class VisionLanguageModel(Model):
    """A loaded vision-language model: `run(image, text=...)`, `generate(image, text=...)`."""

    def run(self, x=None, text: str | None = None, **kw) -> RunResult:
        """The decoder's maps over the picture's tokens and the prompt's, the tower's maps and each image
        token's place (see the module's docstring). kw: dk_scale, dk_layers, hidden, ablate as Model.run."""
        return self._run(x, {}, None, dict(kw, text=text))

    def _run(self, x, hooks: Mapping, cache: tuple | None, kw: dict) -> RunResult:
        kw = dict(kw)
        text = kw.pop("text", None)
        name = self.info.family
        lazy = kw.pop("lazy", None)
        for k, default in (("reuse_prefix", False), ("target", None), ("max_tokens", None), ("image_size", None)):
            if kw.pop(k, default) not in (default, False):
                raise UserError(f"{name}: {k} is not supported yet for vision-language models")
        bad = set(kw) - {"dk_scale", "dk_layers", "hidden", "ablate"}
        if bad:
            raise UserError(f"run takes no argument {sorted(bad)[0]!r}")
        kw["dk_scale"], kw["dk_layers"] = self.check_dk(kw.get("dk_scale", 1.0), kw.get("dk_layers"))
        if kw.get("ablate"):
            ablation_hooks(kw["ablate"], self.info)  # a bad head is refused before any work
        prep = self.prepare(x, text=text)
        hidden = kw.get("hidden", False)
        keep = self._keep_lazily(prep, lazy, hidden, False)  # the decoder's maps, or its q, k and lse (api.lazy)
        vision_bytes = self.vision_maps_bytes(prep)
        tower = vision_bytes <= min(default_budget(self.device), DENSE_MAX_BYTES)
        if not tower:
            prep.notes.append(f"the vision tower's maps ({human_bytes(vision_bytes)}) were not kept: too large")
        elif keep and vision_bytes > self._lazy_bytes(prep):  # a lazy run stays the size of its q and k
            tower = False
            prep.notes.append(f"the vision tower's maps ({human_bytes(vision_bytes)}) were not kept: a lazy run keeps "
                              "the decoder's q and k only (lazy=False keeps every map)")
        prep.inputs["vision_maps"] = tower
        t = self.traced_run(prep, keep, hooks, cache, kw)  # Model's one forward: ablation, context hooks, hooks, cache
        return self._vlm_result(t.out, t.ms, prep, kw["dk_scale"], hidden)

    def _lazy_bytes(self, prep: Prepared) -> int:
        """What the decoder's lazy store of this input keeps (api.lazy.module_kept_bytes)."""
        H, H_kv, d = self._head_shape()
        return module_kept_bytes(self.module, self.token_count(prep), self.info.num_layers, H, H_kv, d,
                                 self.dtype.itemsize)

    def vision_maps_bytes(self, prep: Prepared) -> int:
        """What the tower's float32 maps of this input take: views × layers × heads × tokens²."""
        v = self.module.cfg.vision
        if self.module.cfg.kind in ("qwen2_5_vl", "qwen3_vl"):  # one picture's patches
            P = prep.inputs["pixels"][0].shape[0]
            return v.num_layers * v.num_heads * P * P * 4
        T, _, h, w = prep.inputs["pixels"].shape
        n = (h // v.patch_size) * (w // v.patch_size) + v.num_extra_tokens
        return T * v.num_layers * v.num_heads * n * n * 4

    def trace(self, inputs, hooks=None, names=(), **kw):
        """Model.trace of prepare((image, text)) inside the analyses that serve these models (`analysis(...)`:
        interventions, relevance); every other analysis built on trace is refused in one line."""
        if _ANALYSIS.get() is None:
            raise UserError(f"{self.info.family}: this analysis (the logit lens, probes, norms) is not supported yet "
                            "for vision-language models; relevance, interventions (switching heads off, patching), "
                            "run(image, text=..., ablate=...) and run_with_hooks are")
        return super().trace(inputs, hooks, names, **kw)

    def prepare(self, x, max_tokens: int | None = None, image_size: int | None = None, text: str | None = None
                ) -> Prepared:
        """The picture's pixels and the prompt's ids with the placeholder expanded (the module's inputs). x may be
        the pair (image, text), as analyses take it. max_tokens and image_size are not read (run refuses them)."""
        name = self.info.family
        if text is None and isinstance(x, tuple) and len(x) == 2:  # (image, text): what analyses are given
            x, text = x
        given_text_only = text is None and isinstance(x, str) and not Path(x).exists()  # run("a prompt")
        if x is None or (isinstance(x, str) and not x.strip()) or given_text_only:
            raise UserError(f"{name} is a vision-language model: give it an image (and a prompt: text=...)")
        text = "" if text is None else text
        if not isinstance(text, str):
            raise UserError(f"the prompt must be text, not {type(text).__name__}")
        text_size_ok(text)
        cfg = self.module.cfg
        if cfg.kind in ("qwen2_5_vl", "qwen3_vl"):
            return self._prepare_qwen(x, text)
        if cfg.kind in ("gemma3", "llava_onevision"):  # ids, pixels and places built together (hub.vlm_inputs)
            b = build_inputs(cfg, open_image(x), text, self.tokenizer, self.preprocess, name, self.info.max_positions)
            inputs = {"input_ids": torch.tensor([b.ids], device=self.device),
                      "pixels": torch.from_numpy(b.pixels).to(self.device, self.dtype), **b.extra}
            prep = Prepared(inputs, b.tokens, b.special, len(b.ids), False, b.notes, image=b.seen)
            prep.image_token_positions, prep.image_tiles = b.positions, None
            return prep
        tiles = (0, 0)
        if cfg.kind == "idefics3":  # tiles and a global view (hub.vlm_inputs.tiles_of)
            px, t_rows, t_cols, seen = tiles_of(open_image(x), cfg.vision.image_size, cfg.longest_edge or
                                                cfg.vision.image_size, self.preprocess)
            img = Prepared({"pixels": torch.from_numpy(px).to(self.device, self.dtype)}, image=seen)
            tiles = (t_rows, t_cols)
        else:
            img = self._prepare_image(x, None)
        pixels = img.inputs["pixels"]
        p = cfg.vision.patch_size * cfg.scale_factor
        rows, cols = pixels.shape[-2] // p, pixels.shape[-1] // p
        extra = 0 if cfg.drop_class_token else cfg.vision.num_extra_tokens
        tok = self.tokenizer
        if tok is None:
            raise UserError(f"{name}: the folder has no tokenizer (tokenizer.json); it cannot read a prompt")
        if tok.tok.token_to_id(IMAGE_TOKEN) != cfg.image_token_id:
            raise UserError(f"{name}: the tokenizer has no {IMAGE_TOKEN} token with id {cfg.image_token_id} "
                            "(image_token_index in config.json)")
        bos = tok.tok.id_to_token(cfg.text_bos) if cfg.kind == "paligemma" and cfg.text_bos is not None else None
        ex = expand_prompt(cfg.kind, text, rows * cols + extra, 1, bos, tiles)
        enc = tok.tok.encode(ex.text, add_special_tokens=ex.add_special)
        ids = list(enc.ids)
        if len(ids) > self.info.max_positions:
            raise UserError(f"{name}: {len(ids)} tokens (the picture's {rows * cols + extra} and the prompt's) are "
                            f"more than the model's {self.info.max_positions} positions")
        place = [i for i, t in enumerate(ids) if t == cfg.image_token_id]
        per = rows * cols + extra  # image tokens per view (tile)
        pos = np.array([(i, k // per, *(divmod(k % per - extra, cols) if k % per >= extra else (-1, -1)),
                         cfg.scale_factor) for k, i in enumerate(place)],
                       dtype=np.int32).reshape(-1, len(POSITION_COLUMNS))
        tokens = tok.display(ids)
        n_tiles = tiles[0] * tiles[1]
        for i, tile, r, c, _m in pos:
            where = "" if not n_tiles else "global " if tile == n_tiles else f"t{tile} "
            tokens[i] = f"<image {where}r{r}c{c}>" if r >= 0 else "<image cls>"
        special = [bool(s) or t == cfg.text_bos for s, t in zip(enc.special_tokens_mask, ids)]
        for i in place:
            special[i] = False
        inputs = {"input_ids": torch.tensor([ids], device=self.device), "pixels": pixels}
        if cfg.prefix_lm:
            inputs["prefix_len"] = len(ids)  # PaliGemma: the whole prompt is the prefix
        notes = img.notes + ([ex.note] if ex.note else [])
        prep = Prepared(inputs, tokens, special, len(ids), False, notes, image=img.image)
        prep.image_token_positions = pos
        prep.image_tiles = tiles if n_tiles else None
        return prep

    def _prepare_qwen(self, x, text: str) -> Prepared:
        """Qwen2.5-VL: the picture at its own resolution (hub.vlm_inputs.smart_resize), its patches, and the
        prompt with <|image_pad|> repeated once per merged square; image tokens' positions in merged squares."""
        name, cfg, tok = self.info.family, self.module.cfg, self.tokenizer
        if tok is None:
            raise UserError(f"{name}: the folder has no tokenizer (tokenizer.json); it cannot read a prompt")
        if tok.tok.token_to_id(QWEN_PAD) != cfg.image_token_id:
            raise UserError(f"{name}: the tokenizer has no {QWEN_PAD} token with id {cfg.image_token_id} "
                            "(image_token_id in config.json)")
        patches, grid, seen = qwen_patches(open_image(x), cfg.vision, cfg.min_pixels, cfg.max_pixels, self.preprocess)
        m = cfg.vision.merge
        rows, cols = grid[1] // m, grid[2] // m
        ex = qwen_prompt(text, rows * cols)
        enc = tok.tok.encode(ex.text, add_special_tokens=ex.add_special)
        ids = list(enc.ids)
        if len(ids) > self.info.max_positions:
            raise UserError(f"{name}: {len(ids)} tokens (the picture's {rows * cols} and the prompt's) are more than "
                            f"the model's {self.info.max_positions} positions")
        place = [i for i, t in enumerate(ids) if t == cfg.image_token_id]
        pos = np.array([(i, 0, *divmod(k, cols), m) for k, i in enumerate(place)],
                       dtype=np.int32).reshape(-1, len(POSITION_COLUMNS))
        tokens = tok.display(ids)
        for i, _t, r, c, _m in pos:
            tokens[i] = f"<image r{r}c{c}>"
        special = [bool(s) for s in enc.special_tokens_mask]
        for i in place:
            special[i] = False
        pixels = (torch.from_numpy(patches).to(self.device, self.dtype), grid)
        inputs = {"input_ids": torch.tensor([ids], device=self.device), "pixels": pixels}
        notes = [f"the picture read at {grid[2] * cfg.vision.patch_size} × {grid[1] * cfg.vision.patch_size} px "
                 f"({rows} × {cols} image tokens)"] + ([ex.note] if ex.note else [])
        prep = Prepared(inputs, tokens, special, len(ids), False, notes, image=seen)
        prep.image_token_positions = pos
        prep.image_tiles = None
        return prep

    def _vlm_result(self, out, ms, prep: Prepared, dk_scale, hidden) -> RunResult:
        vision = out.vision_attentions
        vision = None if vision is None else np.ascontiguousarray(vision.float().cpu().numpy(), dtype=np.float32)
        return self._result(out, ms, prep.tokens, prep.special, dk_scale, hidden, grid=out.grid, image=prep.image,
                            notes=prep.notes, total_tokens=len(prep.tokens), vision_attentions=vision,
                            image_token_positions=prep.image_token_positions, image_tiles=prep.image_tiles)

    def generate(self, x=None, text: str | None = None, max_new_tokens: int = 16, **kw) -> Generated:
        """Greedy tokens after the picture and the prompt, through the decoder's KV cache, with each new token's
        attention row. (Sampling is not offered here yet.)"""
        if kw:
            raise UserError(f"{self.info.family}: generate takes no argument {sorted(kw)[0]!r} for a "
                            "vision-language model (greedy only)")
        if not self.module.can_generate:
            raise UserError(f"{self.info.family}: this checkpoint has no LM head: it cannot generate")
        prep = self.prepare(x, text=text)
        ids = prep.inputs["input_ids"][0].tolist()
        gen = Generated(prompt_ids=ids, image_token_positions=prep.image_token_positions)
        cache = self.module.new_cache()
        feed = dict(prep.inputs)
        table = self.active_hooks()
        hooks = Hooks(table) if table else None
        stop = stop_ids(self.module.cfg)
        for _ in range(int(max_new_tokens)):
            with torch.inference_mode():
                out = self.module(output_attentions=True, cache=cache, hooks=hooks, **feed)
                chosen = int(self.module.logits(out.hidden[:, -1:])[0, -1].float().argmax())
            gen.rows.append(out.attentions[0, :, :, -1, :].float().cpu().numpy())
            gen.ids.append(chosen)
            gen.tokens.append(self.tokenizer.display([chosen])[0])
            if chosen in stop:
                break
            feed = {"input_ids": torch.tensor([[chosen]], device=self.device)}
        return gen


def stop_ids(cfg) -> set:
    """The ids generation stops at: the checkpoint's end token, or each of its end tokens where it lists several
    (VLMConfig.text_eos a tuple: gemma-3-4b-it stops at <eos> 1 and <end_of_turn> 106)."""
    eos = getattr(cfg, "text_eos", None)
    return {int(i) for i in eos} if isinstance(eos, (tuple, list)) else ({int(eos)} if eos is not None else set())


@dataclass
class ImageOverlay:
    """One query token's attention to the picture's tokens, put back in place (merges undone: each patch shows the
    weight of the image token it belongs to). views: float32 (T, rows, cols) per view in patch units; picture: the
    tiles assembled as the picture was cut (T - 1 tiles and the global view) or the one view; global_view: the
    global view (Idefics3 / SmolVLM) or None; cls: the weight on a tower's class token (0 when it has none)."""

    views: np.ndarray
    picture: np.ndarray
    global_view: np.ndarray | None
    cls: float = 0.0


def image_overlay(r: RunResult, query: int, layer: int | None = None, head: int | None = None) -> ImageOverlay:
    """Where token `query` of a vision-language run looks in the picture: in `layer`'s `head`, or averaged over
    the heads (head None) and the layers (layer None). Reads r.attention, so it serves dense and lazy runs; only
    the query's row over the image tokens' span is computed (a lazy run: one row of q·kᵀ per head)."""
    pos = r.image_token_positions
    if pos is None:
        raise UserError("this run has no image tokens (run a vision-language model on a picture and a prompt)")
    n = r.num_tokens
    if not isinstance(query, (int, np.integer)) or not -n <= query < n:
        raise UserError(f"query must be a token index from 0 to {n - 1}, got {query!r}")
    L, H = r.attentions.shape[:2]
    layers = range(L) if layer is None else [layer]
    heads = range(H) if head is None else [head]
    lo, hi = int(pos[:, 0].min()), int(pos[:, 0].max()) + 1  # the image tokens' span
    row = np.zeros(n, np.float32)
    row[lo:hi] = np.mean([r.attention(i, h, rows=int(query) % n, cols=(lo, hi)) for i in layers for h in heads],
                         axis=0)
    return place_on_picture(row, pos, r.image_tiles)


def place_on_picture(values: np.ndarray, pos: np.ndarray, tiles: tuple[int, int] | None) -> ImageOverlay:
    """One number per token (N,) put back on the picture: each image token's value at its tile, row and column
    (image_token_positions `pos`), merges undone (each patch shows its image token's value), tiles assembled
    (`tiles`: (rows, cols) of tiles before the global view, or None). Shared by the attention overlay and
    relevance (analysis.relevance_vlm)."""
    merge = int(pos[0, 4])
    placed = pos[pos[:, 2] >= 0]
    T, R, C = int(pos[:, 1].max()) + 1, int(placed[:, 2].max()) + 1, int(placed[:, 3].max()) + 1
    tokens = np.zeros((T, R, C), np.float32)
    tokens[placed[:, 1], placed[:, 2], placed[:, 3]] = values[placed[:, 0]]
    views = tokens.repeat(merge, axis=1).repeat(merge, axis=2)
    cls = float(values[pos[pos[:, 2] < 0, 0]].sum())
    if tiles is None:
        return ImageOverlay(views, views[0], None, cls)
    tr, tc = tiles
    grid = views[:-1].reshape(tr, tc, *views.shape[1:]).transpose(0, 2, 1, 3).reshape(tr * views.shape[1], -1)
    return ImageOverlay(views, grid, views[-1], cls)
