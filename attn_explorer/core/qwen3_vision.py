"""Qwen3-VL's vision tower (the tower only: the model is not wired into core.vlm yet).

Like Qwen2.5-VL's (core.qwen_vision: the processor's merge-block-major patches, a 3-D patch convolution, here
with a bias, and the same 2-D RoPE), with these differences:
- learned positions: a square table of num_position_embeddings (side × side) resized to the picture's patch grid
  (bilinear, corners aligned) and added to the patch vectors;
- every block attends over the whole picture (no windows); LayerNorms (eps 1e-6) and a plain MLP
  (linear_fc1, hidden_act, linear_fc2);
- the merger LayerNorms each patch, puts each merge square's vectors side by side, then Linear, GELU, Linear;
- DeepStack: after the blocks in deepstack_visual_indexes, a merger of its own (its LayerNorm over the merged
  width) turns that block's output into image-token vectors, which the decoder adds to its hidden state at the
  image tokens after its first layers (not wired here yet).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.layers import activation
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.qwen_vision import _turn, patch_positions, vision_rope


@dataclass
class Qwen3VisionConfig:
    dim: int = 1152  # hidden_size
    num_layers: int = 27  # depth
    num_heads: int = 16
    mlp_hidden: int = 4304  # intermediate_size
    out_dim: int = 3584  # out_hidden_size
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge: int = 2  # spatial_merge_size
    num_positions: int = 2304  # num_position_embeddings: a side × side table
    deepstack: list = field(default_factory=lambda: [8, 16, 24])  # deepstack_visual_indexes
    in_channels: int = 3
    rope_theta: float = 10000.0
    act: str = "gelu_tanh"

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def image_size(self) -> int:
        """The smallest side a picture is read at (one merge square); pictures keep their own resolution."""
        return self.patch_size * self.merge

    @property
    def side(self) -> int:
        return int(self.num_positions ** 0.5)


class Qwen3VisionBlock(nn.Module):
    def __init__(self, cfg: Qwen3VisionConfig):
        super().__init__()
        D = cfg.dim
        self.cfg = cfg
        self.norm1, self.norm2 = nn.LayerNorm(D, eps=1e-6), nn.LayerNorm(D, eps=1e-6)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, cfg.mlp_hidden), nn.Linear(cfg.mlp_hidden, D)
        self.act = activation(cfg.act)

    def forward(self, x, cos, sin, allowed: torch.Tensor | None, dk_scale: float = 1.0):
        cfg = self.cfg
        P = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).reshape(P, 3, cfg.num_heads, cfg.head_dim).permute(1, 2, 0, 3).unbind(0)
        q, k = _turn(q, cos, sin), _turn(k, cos, sin)
        scores = q @ k.transpose(-1, -2) * (cfg.head_dim ** -0.5 * dk_scale)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        maps = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        x = x + self.proj((maps @ v).transpose(0, 1).reshape(P, -1))
        return x + self.fc2(self.act(self.fc1(self.norm2(x)))), maps


class Qwen3Merger(nn.Module):
    def __init__(self, cfg: Qwen3VisionConfig, postshuffle: bool):
        super().__init__()
        W = cfg.dim * cfg.merge ** 2
        self.width, self.postshuffle = W, postshuffle
        self.norm = nn.LayerNorm(W if postshuffle else cfg.dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(W, W), nn.Linear(W, cfg.out_dim)

    def forward(self, x):
        x = self.norm(x.reshape(-1, self.width)) if self.postshuffle else self.norm(x).reshape(-1, self.width)
        return self.fc2(F.gelu(self.fc1(x)))


class Qwen3VisionTower(nn.Module):
    def __init__(self, cfg: Qwen3VisionConfig):
        super().__init__()
        self.cfg = cfg
        k = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed = nn.Conv3d(cfg.in_channels, cfg.dim, kernel_size=k, stride=k, bias=True)
        self.pos_embed = nn.Embedding(cfg.num_positions, cfg.dim)
        self.blocks = nn.ModuleList([Qwen3VisionBlock(cfg) for _ in range(cfg.num_layers)])
        self.merger = Qwen3Merger(cfg, postshuffle=False)
        self.deepstack = nn.ModuleList([Qwen3Merger(cfg, postshuffle=True) for _ in cfg.deepstack])

    def positions(self, grid) -> torch.Tensor:
        """(P, D): the learned table resized to the (h, w) patch grid, in the processor's patch order."""
        t, h, w = grid
        s = self.cfg.side
        table = self.pos_embed.weight.reshape(s, s, -1).permute(2, 0, 1)[None].float()
        table = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0]  # (D, h, w)
        pos = patch_positions(grid, self.cfg.merge).to(table.device)
        return table[:, pos[:, 0], pos[:, 1]].T.to(self.pos_embed.weight.dtype)

    def forward(self, patches: torch.Tensor, grid: tuple[int, int, int], dk_scale: float = 1.0,
                output_attentions: bool = False, **_) -> ModelOutput:
        """As core.qwen_vision.QwenVisionTower.forward; also `deepstack`, a list of (P / merge², out_dim)."""
        cfg = self.cfg
        t, h, w = grid
        p = cfg.patch_size
        x = patches.reshape(-1, cfg.in_channels, cfg.temporal_patch_size, p, p)
        x = self.patch_embed(x.to(self.patch_embed.weight.dtype)).reshape(-1, cfg.dim)
        x = x + self.positions(grid)
        cos, sin = vision_rope(cfg, grid, x.device)
        frame = torch.arange(t, device=x.device).repeat_interleave(h * w)
        allowed = None if t == 1 else frame[:, None] == frame[None, :]
        maps, stacked = [], []
        for i, blk in enumerate(self.blocks):
            x, a = blk(x, cos, sin, allowed, dk_scale)
            if output_attentions:
                maps.append(a)
            if i in cfg.deepstack:
                stacked.append(self.deepstack[cfg.deepstack.index(i)](x))
        out = ModelOutput(hidden=self.merger(x), attentions=torch.stack(maps) if output_attentions else None)
        out.blocks_out, out.deepstack, out.grid = x, stacked, (h, w)
        return out


QWEN3_VISION_RULES = [
    (r"patch_embed\.proj\.(weight|bias)", r"patch_embed.\1"),
    (r"pos_embed\.weight", "pos_embed.weight"),
    (r"blocks\.(\d+)\.(norm1|norm2)\.(weight|bias)", r"blocks.\1.\2.\3"),
    (r"blocks\.(\d+)\.attn\.(qkv|proj)\.(weight|bias)", r"blocks.\1.\2.\3"),
    (r"blocks\.(\d+)\.mlp\.linear_fc(1|2)\.(weight|bias)", r"blocks.\1.fc\2.\3"),
    (r"merger\.norm\.(weight|bias)", r"merger.norm.\1"),
    (r"merger\.linear_fc(1|2)\.(weight|bias)", r"merger.fc\1.\2"),
    (r"deepstack_merger_list\.(\d+)\.norm\.(weight|bias)", r"deepstack.\1.norm.\2"),
    (r"deepstack_merger_list\.(\d+)\.linear_fc(1|2)\.(weight|bias)", r"deepstack.\1.fc\2.\3"),
]
