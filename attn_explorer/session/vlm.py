"""Vision-language runs in the window (issue 26 B): one token's attention put back on the picture, computed in
the session's worker (api.vlm.image_overlay reads r.attention, so dense and lazy runs both serve it) and handed
to the overlay page as plain NumPy arrays.

`AVERAGES` are the overlay page's choices: the selected head, the selected layer's heads averaged, or every
layer and head averaged. The job also returns each head of the selected layer, for the page's small overlays.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_explorer.session.long_view import result_tag

AVERAGES = {"head": "the selected head", "layer": "the layer's heads averaged", "all": "every layer and head averaged"}
VLM_LANE = "vlm-overlay"


@dataclass
class VlmOverlay:
    """What the overlay page draws for token `query`: `picture` (rows, cols) in patch units (tiles assembled,
    merges undone) for `average`; `heads` (H, rows, cols), each head of `layer`; the weight on the global view
    (Idefics3 / SmolVLM tiles) and on a tower's class token; `image` the run's image-token count."""

    tag: int
    query: int
    layer: int
    head: int
    average: str
    picture: np.ndarray
    heads: np.ndarray
    global_weight: float
    cls: float
    total: float


def is_vlm(r: Any) -> bool:
    """A run of a vision-language model: its image tokens have places in the picture."""
    return r is not None and getattr(r, "image_token_positions", None) is not None


def patch_grid_of(r: Any):
    """r.grid where the run's tokens are an image model's patches; None for a vision-language run (its r.grid is
    the tower's grid, while the decoder's maps are over image and text tokens: pages that place rows on a patch
    grid read them as tokens instead)."""
    return None if r is None or is_vlm(r) else r.grid


def vlm_overlay_job(r: Any, query: int, layer: int, head: int, average: str = "head") -> VlmOverlay:
    """Token `query`'s attention to the picture (see VlmOverlay). Runs in the worker."""
    from attn_explorer.api.vlm import image_overlay

    if average not in AVERAGES:
        raise ValueError(f"average must be one of {', '.join(AVERAGES)}, not {average!r}")
    H = int(r.attentions.shape[1])
    per_head = [image_overlay(r, query, layer, h) for h in range(H)]
    if average == "head":
        shown = per_head[head]
    elif average == "layer":
        shown = image_overlay(r, query, layer, None)
    else:
        shown = image_overlay(r, query, None, None)
    pos = r.image_token_positions
    row = np.mean([r.attention(layer, head, rows=int(query))] if average == "head" else
                  [r.attention(i, h, rows=int(query)) for i in ([layer] if average == "layer"
                                                              else range(r.attentions.shape[0])) for h in range(H)],
                  axis=0)
    glob = float(shown.global_view.sum() / (int(pos[0, 4]) ** 2)) if shown.global_view is not None else 0.0
    return VlmOverlay(tag=result_tag(r), query=int(query), layer=int(layer), head=int(head), average=average,
                      picture=np.ascontiguousarray(shown.picture, np.float32),
                      heads=np.stack([np.ascontiguousarray(o.picture, np.float32) for o in per_head]),
                      global_weight=glob, cls=float(shown.cls), total=float(row[pos[:, 0]].sum()))


@dataclass
class ImageBlock:
    """One run of image tokens the one-head view draws as a labelled band: tokens start..stop-1, one view (a tile,
    the global view, or the one picture) of rows × cols image tokens; `label` in words ("image tile 2 (t1),
    16 × 16", "image global view, 16 × 16", "image 16 × 16"; OneVision's "image base view, 27 × 27" and "image canvas,
    54 × 54 + 54 row ends"), `short` for an axis ("tile 2 16×16")."""

    start: int
    stop: int
    tile: int
    rows: int
    cols: int
    label: str
    short: str


def _unplaced(mine: np.ndarray) -> str:
    """The label's words for a view's image tokens without a place ((row, col) -1): a token right after a placed
    one ends a row (LLaVA OneVision's newline tokens, one per row of the canvas), any other is the tower's class
    token (LLaVA's "full" strategy keeps it ahead of the patches)."""
    mine = mine[np.argsort(mine[:, 0])]
    loose = np.flatnonzero(mine[:, 2] < 0)
    if not loose.size:
        return ""
    ends = int(sum(1 for i in loose if i > 0 and mine[i - 1, 2] >= 0 and mine[i - 1, 0] == mine[i, 0] - 1))
    cls = loose.size - ends
    words = ([f"{ends} row end{'s' if ends != 1 else ''}"] if ends else []) + \
        ([("class token" if cls == 1 else f"{cls} class tokens")] if cls else [])
    return " + " + " + ".join(words)


def image_blocks(r: Any) -> list[ImageBlock]:
    """The image tokens of a vision-language run as contiguous blocks, one per view (a view split by other tokens
    gives one block per run); [] for any other run."""
    if not is_vlm(r):
        return []
    pos = r.image_token_positions
    tiles = r.image_tiles
    n_tiles = tiles[0] * tiles[1] if tiles is not None else 0
    # LLaVA OneVision runs without image_tiles yet has two views: tile 0 the canvas, tile 1 the base view
    two_views = tiles is None and set(np.unique(pos[:, 1]).tolist()) == {0, 1}
    out = []
    for t in np.unique(pos[:, 1]):
        mine = pos[pos[:, 1] == t]
        placed = mine[mine[:, 2] >= 0]
        R, C = (int(placed[:, 2].max()) + 1, int(placed[:, 3].max()) + 1) if len(placed) else (0, 0)
        cls = _unplaced(mine)
        if two_views:
            name = "canvas" if t == 0 else "base view"
            label, short = f"image {name}, {R} × {C}{cls}", f"{name.split()[0]} {R}×{C}"
        elif not n_tiles:
            label, short = f"image {R} × {C}{cls}", f"image {R}×{C}"
        elif t == n_tiles:
            label, short = f"image global view, {R} × {C}{cls}", f"global {R}×{C}"
        else:
            label, short = f"image tile {t + 1} (t{t}), {R} × {C}{cls}", f"tile {t + 1} {R}×{C}"
        idx = np.sort(mine[:, 0])
        for run in np.split(idx, np.flatnonzero(np.diff(idx) != 1) + 1):
            out.append(ImageBlock(int(run[0]), int(run[-1]) + 1, int(t), R, C, label, short))
    return sorted(out, key=lambda b: b.start)
