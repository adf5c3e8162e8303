"""Images into tokens: non-overlapping patches, a class token, and resizable position grids."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PatchEmbed(nn.Module):
    """Cut an image into patch_size × patch_size squares and project each to a dim-vector.

    A strided convolution is exactly "flatten each patch, multiply by one shared matrix".
    """

    def __init__(self, patch_size: int, dim: int, in_channels: int = 3):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """pixels (B, C, H, W) -> (tokens (B, rows*cols, D), (rows, cols))."""
        x = self.proj(pixels)  # (B, D, rows, cols)
        grid = (x.shape[-2], x.shape[-1])
        return x.flatten(2).transpose(1, 2), grid


def resize_position_grid(
    pos: torch.Tensor, grid: tuple[int, int], antialias: bool = False
) -> torch.Tensor:
    """Bicubically resize a square grid of patch position vectors pos (1, G*G, D) to (1, rows*cols, D).

    Interpolation runs in float32 (bicubic in half precision shifts the embeddings), as HF does.
    """
    side = int(round(pos.shape[1] ** 0.5))
    D = pos.shape[-1]
    g = pos.reshape(1, side, side, D).permute(0, 3, 1, 2)  # (1, D, G, G)
    g = F.interpolate(g.float(), size=grid, mode="bicubic", align_corners=False, antialias=antialias)
    return g.to(pos.dtype).permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], D)
