"""Connectors and masks of two vision-language families (used by core.vlm):

- Gemma 3: the SigLIP tower's normed patches pooled (a k × k average over the patch grid, so that
  mm_tokens_per_image tokens remain), a (1 + w) RMS norm over the tower's width, then one (D_v, D) matrix
  (stored as it multiplies: in, out). In the decoder each run of image tokens attends to itself both ways;
  the windowed layers keep their window on top of that (`gemma3_masks`).
- LLaVA OneVision ("anyres"): the picture at the tower's size (the base view) and the picture resized into a
  canvas of tiles (the grid pinpoint that fits it best, padded to it); each view's patches go through the MLP
  projector, the tiles' patches are laid out as one canvas, the padding cut off, the canvas shrunk bilinearly
  when it holds more than max_tiles tiles' worth of patches, and a learned newline vector ends each row.
  `anyres_layout` gives the sizes (the processor counts tokens with the same arithmetic).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.layers import RMSNorm


class SoftEmbProjector(nn.Module):
    """Gemma 3's multi-modal projector: (T, side², D_v) tower output -> (T, (side / pool)², D)."""

    def __init__(self, side: int, pool: int, d_vision: int, d_text: int, eps: float):
        super().__init__()
        self.side, self.pool = side, pool
        self.mm_soft_emb_norm = RMSNorm(d_vision, eps=eps, unit_offset=True)
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(d_vision, d_text))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T, _, D = x.shape
        grid = x.transpose(1, 2).reshape(T, D, self.side, self.side)
        pooled = F.avg_pool2d(grid, kernel_size=self.pool, stride=self.pool).flatten(2).transpose(1, 2)
        return torch.matmul(self.mm_soft_emb_norm(pooled), self.mm_input_projection_weight).type_as(x)


def image_blocks(is_image: torch.Tensor) -> torch.Tensor:
    """(B, N) bool -> (B, N) long: each run of consecutive image tokens numbered 0, 1, ...; text tokens -1."""
    before = F.pad(is_image, (1, 0), value=False)[:, :-1]
    run = torch.cumsum((is_image & ~before).long(), dim=1) - 1
    return torch.where(is_image, run, torch.full_like(run, -1))


def gemma3_masks(is_image: torch.Tensor, window: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gemma 3's prompt masks, bool (B, 1, N, N), True = may attend: the global layers' (causal, or both tokens
    in the same run of image tokens) and the windowed layers' (that, and the key less than `window` back)."""
    block = image_blocks(is_image)
    N = is_image.shape[1]
    q = torch.arange(N, device=is_image.device)[:, None]
    k = torch.arange(N, device=is_image.device)[None, :]
    same = (block[:, :, None] == block[:, None, :]) & (block[:, :, None] >= 0)
    full = ((k <= q)[None] | same)[:, None]
    local = None if window is None else full & (k > q - window)[None, None]
    return full, local


@dataclass(frozen=True)
class AnyresLayout:
    """One picture's anyres sizes: the canvas in tiles (rows, cols), in patches before the padding is cut
    (height, width), the rows and columns kept (top, left, height, width) and the size after the shrink
    (rows, cols of image tokens, each row then ended by a newline token)."""

    tiles: tuple[int, int]
    canvas: tuple[int, int]
    kept: tuple[int, int, int, int]
    out: tuple[int, int]

    @property
    def tokens(self) -> int:
        """Image tokens of the canvas part (its rows' newline tokens included)."""
        return self.out[0] * (self.out[1] + 1)


def best_resolution(size: tuple[int, int], pinpoints: list) -> tuple[int, int]:
    """The (height, width) of `pinpoints` that keeps the most of a (height, width) picture and wastes the least."""
    h, w = size
    best, most, waste = None, 0, math.inf
    for ph, pw in pinpoints:
        s = min(pw / w, ph / h)
        kept = min(int(w * s) * int(h * s), w * h)
        wasted = ph * pw - kept
        if kept > most or (kept == most and wasted < waste):
            best, most, waste = (ph, pw), kept, wasted
    return best


def anyres_layout(size: tuple[int, int], pinpoints: list, image_size: int, side: int, max_tiles: int
                  ) -> AnyresLayout:
    """The layout of a (height, width) picture: `side` patches a tile side at the tower's `image_size` px."""
    h, w = size
    ph, pw = best_resolution(size, pinpoints)
    rows, cols = ph // image_size, pw // image_size
    H, W = rows * side, cols * side
    top, left, kh, kw = 0, 0, H, W
    if w / h > W / H:  # wider than the canvas: rows of padding above and below
        pad = (H - int(round(h * (W / w), 7))) // 2
        top, kh = pad, H - 2 * pad
    else:
        pad = (W - int(round(w * (H / h), 7))) // 2
        left, kw = pad, W - 2 * pad
    ratio = math.sqrt(kh * kw / (max_tiles * side ** 2))
    out = (int(kh // ratio), int(kw // ratio)) if ratio > 1.1 else (kh, kw)
    return AnyresLayout((rows, cols), (H, W), (top, left, kh, kw), out)


def pack_anyres(feats: torch.Tensor, layout: AnyresLayout, newline: torch.Tensor) -> torch.Tensor:
    """(1 + rows·cols, side², D) projected views (the base view first, then the tiles row by row) -> the image
    tokens' vectors: the base view's, then the canvas row by row, each row ended by `newline`."""
    _, P, D = feats.shape
    side = math.isqrt(P)
    rows, cols = layout.tiles
    canvas = feats[1:].reshape(rows, cols, side, side, D).permute(4, 0, 2, 1, 3).reshape(D, rows * side, cols * side)
    top, left, kh, kw = layout.kept
    canvas = canvas[:, top:top + kh, left:left + kw]
    if layout.out != (kh, kw):
        canvas = F.interpolate(canvas[None], list(layout.out), mode="bilinear")[0]
    canvas = torch.cat([canvas, newline[:, None, None].expand(D, canvas.shape[1], 1).to(canvas)], dim=-1)
    return torch.cat([feats[0], canvas.flatten(1).transpose(0, 1)], dim=0)
