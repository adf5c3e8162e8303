"""Generation after a picture and a prompt, streamed step by step (issue 26 B: "generation shows each new word's
overlay as it is written").

`VisionLanguageModel.generate` (api.vlm) hands back the whole generation at the end. The Generate page needs
each step as it comes, so `vlm_generation_job` runs the same greedy loop on the model's public pieces
(`m.prepare(image, text=...)`, `m.module(..., cache=m.module.new_cache())`, `m.module.logits`) and yields, in
the worker, first a `VlmPromptInfo` (the prompt's tokens, the picture the model sees and each image token's
place), then one `api.generate.Step` per new token, whose `attention` (L, H, n) is the row of the query that
chose that token over every earlier token, image and text. tests/session/test_vlm_generation.py checks the
tokens and rows against `m.generate`.

`step_overlay` puts one step's row back on the picture through `api.vlm.place_on_picture`, as image_overlay does
for a run (NumPy only: it runs in the GUI thread on the step's plain arrays, no torch), for the selected head, the layer's heads averaged or
every layer and head averaged (session.vlm.AVERAGES).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_explorer.session.prompt_info import PromptInfo
from attn_explorer.session.vlm import AVERAGES

SHOWN = 10  # next-token bars


@dataclass
class VlmPromptInfo(PromptInfo):
    """The prompt as the vision-language model reads it: `tokens` with the image tokens labelled "<image r3c5>",
    `image` the picture the model sees (uint8 H, W, 3), `image_token_positions` (token, tile, row, col, merge)
    and `image_tiles` ((rows, cols) of tiles, or None for one view)."""

    image: np.ndarray | None = None
    image_token_positions: np.ndarray | None = None
    image_tiles: tuple[int, int] | None = None


@dataclass
class StepOverlay:
    """One step's attention on the picture: `picture` (rows, cols) in patch units (tiles assembled, merges
    undone), `total` the share of the row on the image tokens, `global_weight` the share on a global view
    (tiles; not drawn), `cls` on a tower's class token (no place in the picture)."""

    picture: np.ndarray
    total: float
    global_weight: float
    cls: float


def vlm_generation_job(model: Any, image: Any, text: str, max_new_tokens: int):
    """Runs in a worker: yields a VlmPromptInfo, then a greedy api.generate.Step per new token (each with its
    row over every earlier token). Returns the step count. Stops at the model's end token."""
    import torch

    from attn_explorer.api.generate import Step
    from attn_explorer.api.vlm import stop_ids
    from attn_explorer.errors import UserError
    from attn_explorer.session.jobs import configure_torch

    configure_torch()
    if not model.module.can_generate:
        raise UserError(f"{model.info.family}: this checkpoint has no LM head: it cannot generate")
    prep = model.prepare(image, text=text)
    ids = prep.inputs["input_ids"][0].tolist()
    n_new = int(max_new_tokens)
    if len(ids) + n_new > model.info.max_positions:
        raise UserError(f"{len(ids)} tokens (picture and prompt) + {n_new} new ones exceed {model.info.name}'s "
                        f"{model.info.max_positions} positions")
    tok = model.tokenizer
    yield VlmPromptInfo(text, list(prep.tokens), list(ids), image=prep.image,
                        image_token_positions=prep.image_token_positions, image_tiles=prep.image_tiles)
    module, cache, feed = model.module, model.module.new_cache(), dict(prep.inputs)
    stop = stop_ids(module.cfg)  # any of the checkpoint's end tokens (Gemma 3 lists two)
    new: list[int] = []
    shown = ""
    for index in range(n_new):
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = module(output_attentions=True, cache=cache, **feed)
            logits = module.logits(out.hidden[:, -1:])[0, -1].float().cpu()
            ms = (time.perf_counter() - t0) * 1000
            probs = torch.softmax(logits, dim=-1)
            chosen = int(logits.argmax())
            top = probs.topk(min(SHOWN, probs.numel()))
            row = out.attentions[0, :, :, -1, :].float().cpu().numpy()  # (L, H, n so far)
        ids.append(chosen)
        new.append(chosen)
        last = chosen in stop or index == n_new - 1
        whole = tok.tok.decode(new, skip_special_tokens=False)
        stable = whole if last else whole.rstrip("\ufffd")  # a character split over byte tokens: wait for it
        added, shown = stable[len(shown):], stable
        top_ids = [int(i) for i in top.indices]
        yield Step(index=index, token_id=chosen, token=tok.display([chosen])[0], text=added, position=len(ids) - 1,
                   top_ids=top_ids, top_tokens=tok.display(top_ids), top_probs=[float(p) for p in top.values],
                   attention=np.ascontiguousarray(row, dtype=np.float32), ms=ms, last=last)
        if last:
            return index + 1
        feed = {"input_ids": torch.tensor([[chosen]], device=model.device)}
    return n_new


def step_overlay(step: Any, prompt: VlmPromptInfo, layer: int, head: int, average: str = "all") -> StepOverlay:
    """Where the query that chose `step`'s token looked in the picture (see StepOverlay): its row, one head,
    the layer's heads or every layer and head averaged, placed by api.vlm.place_on_picture."""
    from attn_explorer.api.vlm import place_on_picture

    if average not in AVERAGES:
        raise ValueError(f"average must be one of {', '.join(AVERAGES)}, not {average!r}")
    rows = step.attention  # (L, H, n)
    if average != "all":
        rows = rows[int(layer):int(layer) + 1]
    if average == "head":
        rows = rows[:, int(head):int(head) + 1]
    mean = rows.reshape(-1, rows.shape[-1]).mean(axis=0)
    pos = prompt.image_token_positions
    got = place_on_picture(mean, pos, prompt.image_tiles)
    glob = float(got.global_view.sum() / (int(pos[0, 4]) ** 2)) if got.global_view is not None else 0.0
    return StepOverlay(np.ascontiguousarray(got.picture, np.float32), float(mean[pos[:, 0]].sum()), glob,
                       float(got.cls))
