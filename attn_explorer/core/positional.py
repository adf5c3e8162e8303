"""Positional encodings: the primer's sinusoidal table and RoPE. (Learned absolute positions are
plain nn.Embedding tables in the models that use them.)"""
from __future__ import annotations

import math

import torch


def sinusoidal_positions(n: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(n, dim) table: PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(same)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(base) / dim))
    pe = torch.zeros(n, dim)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return pe


def rope_tables(n: int, head_dim: int, base: float = 10000.0, device=None, dtype=torch.float32,
                linear_factor: float = 1.0):
    """(cos, sin), each (n, head_dim), for rotary position embedding (Llama's half-split layout).
    linear_factor > 1 slows every frequency by that factor (linear RoPE scaling: positions / factor)."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    if linear_factor != 1.0:
        inv = inv / linear_factor
    ang = torch.arange(n, dtype=torch.float32, device=device)[:, None] * inv[None, :]  # (n, d/2)
    ang = torch.cat([ang, ang], dim=-1)  # (n, d)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+r/2}) of x (B, H, N, d) by each position's angle, where r is the tables'
    width: r = d rotates every dimension; r < d (partial rotary, GPT-NeoX's rotary_pct) rotates the
    first r and passes the other d - r through unchanged."""
    cos, sin = tables
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], tables), x[..., r:]], dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
