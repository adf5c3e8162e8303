"""Qwen2.5-VL's vision tower: a ViT with 2-D RoPE, windowed attention blocks and a patch merger.

- Patches: the processor cuts the (resized) picture into patch × patch squares, each taken temporal_patch_size
  times (a still picture is repeated), and lists them merge-block-major: each spatial_merge_size² square of
  patches (one future image token) row by row, its patches row by row inside. One 3-D convolution without bias
  (kernel = stride = temporal_patch_size × patch × patch) makes each a vector.
- Positions: 2-D RoPE. Each head's first quarter of frequencies turns with the patch's row, the second with its
  column (base rope_theta, frequencies over head_dim / 2), the whole head rotated (rotate_half).
- Blocks: pre-norm RMSNorm (eps 1e-6), attention with a fused qkv (biases), a SwiGLU MLP with biases. Blocks in
  fullatt_block_indexes attend over the whole picture; the others only within their window: a square of
  window_size px, i.e. window_size / patch / merge image tokens a side, counted from the top left.
  transformers reorders the patches window by window and runs each window alone; attention is the same for any
  order, so here each patch keeps its place and a mask keeps a window's patches to themselves. The maps are
  therefore in the processor's patch order, with exact zeros outside a window.
- Merger: RMSNorm (eps 1e-6), each merge square's vectors side by side, then Linear, GELU, Linear to the
  decoder's width: one vector per image token, in the processor's order (row by row of merge squares).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.layers import activation
from attn_explorer.core.output import ModelOutput


@dataclass
class QwenVisionConfig:
    dim: int = 1280  # hidden_size
    num_layers: int = 32  # depth
    num_heads: int = 16
    mlp_hidden: int = 3420  # intermediate_size
    out_dim: int = 3584  # out_hidden_size: the decoder's width
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge: int = 2  # spatial_merge_size
    window_size: int = 112  # px
    full_layers: list = field(default_factory=lambda: [7, 15, 23, 31])  # fullatt_block_indexes
    in_channels: int = 3
    rope_theta: float = 10000.0
    act: str = "silu"
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def image_size(self) -> int:
        """The smallest side a picture is read at (one merge square: patch × merge px); pictures are read at
        their own resolution (hub.vlm_inputs.smart_resize)."""
        return self.patch_size * self.merge

    @property
    def window_tokens(self) -> int:
        """A window's side in image tokens (merge squares)."""
        return self.window_size // self.merge // self.patch_size

    def layer_kinds(self) -> list[str]:
        w = self.window_size
        return ["global" if i in self.full_layers else f"local, window {w} px" for i in range(self.num_layers)]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return _rms(x, self.weight, self.eps)


class QwenVisionBlock(nn.Module):
    def __init__(self, cfg: QwenVisionConfig):
        super().__init__()
        D, M = cfg.dim, cfg.mlp_hidden
        self.cfg = cfg
        self.norm1, self.norm2 = RMSNorm(D, cfg.eps), RMSNorm(D, cfg.eps)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(D, M), nn.Linear(D, M), nn.Linear(M, D)
        self.act = activation(cfg.act)

    def forward(self, x, cos, sin, allowed: torch.Tensor | None, dk_scale: float = 1.0):
        """x (P, D); cos, sin (P, d_k); allowed bool (P, P) or None (all). Returns (x, maps (H, P, P))."""
        cfg = self.cfg
        P = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).reshape(P, 3, cfg.num_heads, cfg.head_dim).permute(1, 2, 0, 3).unbind(0)
        q, k = _turn(q, cos, sin), _turn(k, cos, sin)
        scores = q @ k.transpose(-1, -2) * (cfg.head_dim ** -0.5 * dk_scale)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        maps = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = (maps @ v).transpose(0, 1).reshape(P, -1)
        x = x + self.proj(out)
        h = self.norm2(x)
        return x + self.down_proj(self.act(self.gate_proj(h)) * self.up_proj(h)), maps


def _turn(x, cos, sin):
    half = x.shape[-1] // 2
    dtype = x.dtype
    x = x.float()
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos.float() + turned * sin.float()).to(dtype)


def patch_positions(grid: tuple[int, int, int], merge: int) -> torch.Tensor:
    """(P, 2) long: each patch's (row, col) in the processor's merge-block-major order (t frames in turn)."""
    t, h, w = grid
    rows = torch.arange(h)[:, None].expand(h, w)
    cols = torch.arange(w)[None, :].expand(h, w)
    shape = (h // merge, merge, w // merge, merge)
    rows = rows.reshape(shape).transpose(1, 2).flatten()
    cols = cols.reshape(shape).transpose(1, 2).flatten()
    return torch.stack([rows, cols], -1).repeat(t, 1)


def vision_rope(cfg, grid, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The tower's 2-D RoPE (cos, sin), each (P, d_k): the first half of the frequencies turned by the patch's row,
    the second by its column (each over d_k / 4 frequencies of base rope_theta), repeated for rotate_half."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float, device=device) / half))
    pos = patch_positions(grid, cfg.merge).to(device)
    freqs = pos[..., None].float() * inv_freq  # (P, 2, d_k / 4)
    freqs = torch.cat([freqs[:, 0], freqs[:, 1]], -1)
    freqs = torch.cat([freqs, freqs], -1)
    return freqs.cos(), freqs.sin()


class QwenVisionTower(nn.Module):
    def __init__(self, cfg: QwenVisionConfig):
        super().__init__()
        self.cfg = cfg
        k = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed = nn.Conv3d(cfg.in_channels, cfg.dim, kernel_size=k, stride=k, bias=False)
        self.blocks = nn.ModuleList([QwenVisionBlock(cfg) for _ in range(cfg.num_layers)])
        W = cfg.dim * cfg.merge ** 2
        self.ln_q = RMSNorm(cfg.dim, 1e-6)
        self.merger_fc1, self.merger_fc2 = nn.Linear(W, W), nn.Linear(W, cfg.out_dim)

    def rope(self, grid, device):
        return vision_rope(self.cfg, grid, device)

    def windows(self, grid, device) -> torch.Tensor:
        """(P,) long: each patch's window, numbered per frame."""
        cfg = self.cfg
        t, h, w = grid
        m, ws = cfg.merge, cfg.window_tokens
        pos = patch_positions(grid, m).to(device)
        r, c = pos[:, 0] // m // ws, pos[:, 1] // m // ws
        frame = torch.arange(t, device=device).repeat_interleave(h * w)
        per_row = -(-(w // m) // ws)
        per_frame = -(-(h // m) // ws) * per_row
        return frame * per_frame + r * per_row + c

    def forward(self, patches: torch.Tensor, grid: tuple[int, int, int], dk_scale: float = 1.0,
                output_attentions: bool = False, **_) -> ModelOutput:
        """patches (P, C·T·p·p) as the processor flattens them, grid (t, h, w) in patches. Returns hidden =
        the merged vectors (P / merge², out_dim), `blocks_out` the last block's output (P, D), attentions
        (L, H, P, P) in the processor's patch order (or None)."""
        cfg = self.cfg
        t, h, w = grid
        p = cfg.patch_size
        x = patches.reshape(-1, cfg.in_channels, cfg.temporal_patch_size, p, p)
        x = self.patch_embed(x.to(self.patch_embed.weight.dtype)).reshape(-1, cfg.dim)
        cos, sin = self.rope(grid, x.device)
        win = self.windows(grid, x.device)
        local = win[:, None] == win[None, :]
        frame = torch.arange(t, device=x.device).repeat_interleave(h * w)
        whole = None if t == 1 else frame[:, None] == frame[None, :]
        maps = []
        for i, blk in enumerate(self.blocks):
            x, a = blk(x, cos, sin, whole if i in cfg.full_layers else local, dk_scale)
            if output_attentions:
                maps.append(a)
        last = x
        y = self.ln_q(x).reshape(-1, cfg.dim * cfg.merge ** 2)
        y = self.merger_fc2(F.gelu(self.merger_fc1(y)))
        out = ModelOutput(hidden=y, attentions=torch.stack(maps) if output_attentions else None)
        out.blocks_out = last
        out.grid = (h // cfg.merge, w // cfg.merge)
        return out


# transformers' names -> ours (the tower's part of a checkpoint, after its prefix)
QWEN_VISION_RULES = [
    (r"patch_embed\.proj\.weight", "patch_embed.weight"),
    (r"blocks\.(\d+)\.norm(1|2)\.weight", r"blocks.\1.norm\2.weight"),
    (r"blocks\.(\d+)\.attn\.(qkv|proj)\.(weight|bias)", r"blocks.\1.\2.\3"),
    (r"blocks\.(\d+)\.mlp\.(gate_proj|up_proj|down_proj)\.(weight|bias)", r"blocks.\1.\2.\3"),
    (r"merger\.ln_q\.weight", "ln_q.weight"),
    (r"merger\.mlp\.0\.(weight|bias)", r"merger_fc1.\1"),
    (r"merger\.mlp\.2\.(weight|bias)", r"merger_fc2.\1"),
]


# The decoder's multimodal RoPE (M-RoPE)

def mrope_positions(ids: list[int], image_token_id: int, grids: list[tuple[int, int]]) -> tuple[torch.Tensor, int]:
    """(3, N) long: each token's (t, h, w) position, and delta = the next position - N (generation's offset).
    Text tokens count on (all three the same); each run of image tokens (a picture's merged grid (rows, cols),
    row by row) sits at start + (0, row, col), and the text after it starts at start + max(rows, cols)."""
    out, pos, i, n, pictures = [], 0, 0, len(ids), iter(grids)
    while i < n:
        if ids[i] != image_token_id:
            j = i
            while j < n and ids[j] != image_token_id:
                j += 1
            out.append(torch.arange(pos, pos + j - i).expand(3, -1))
            pos += j - i
        else:
            rows, cols = next(pictures)
            j = i + rows * cols
            r = torch.arange(rows).repeat_interleave(cols)
            c = torch.arange(cols).repeat(rows)
            out.append(torch.stack([torch.zeros_like(r), r, c]) + pos)
            pos += max(rows, cols)
        i = j
    positions = torch.cat(out, 1) if out else torch.zeros(3, 0, dtype=torch.long)
    return positions, int(positions.max()) + 1 - n if n else 0


def mrope_tables(positions: torch.Tensor, head_dim: int, theta: float, section: list[int], dtype=torch.float32,
                 interleaved: bool = False):
    """(cos, sin), each (N, head_dim), of M-RoPE: the frequencies split into mrope_section's parts (summing to
    head_dim / 2), part i turned by position axis i % 3 (t, h, w), then repeated for rotate_half's two halves.
    interleaved (Qwen3-VL): frequency j turns with h where j % 3 == 1 and j < 3·section[1], with w where
    j % 3 == 2 and j < 3·section[2], with t elsewhere."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=positions.device) / head_dim))
    freqs = positions[..., None].float() * inv_freq  # (3, N, d / 2)
    if interleaved:
        out = freqs[0].clone()
        for axis in (1, 2):
            out[..., axis:3 * section[axis]:3] = freqs[axis, ..., axis:3 * section[axis]:3]
        freqs = out
    else:
        freqs = torch.cat([part[i % 3] for i, part in enumerate(freqs.split(list(section), dim=-1))], -1)
    freqs = torch.cat([freqs, freqs], -1)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)
