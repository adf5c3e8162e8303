"""Positional encodings: the primer's sinusoidal table and RoPE, with every frequency scaling transformers
knows (linear, dynamic NTK, YaRN, LongRoPE, Llama 3, proportional). (Learned absolute positions are
plain nn.Embedding tables in the models that use them.)"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def sinusoidal_positions(n: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(n, dim) table: PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(same)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(base) / dim))
    pe = torch.zeros(n, dim)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return pe


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE's frequencies are changed to reach past the positions a model was trained on: one of
    transformers' rope types (its ROPE_INIT_FUNCTIONS) with its numbers, under transformers' names."""

    kind: str = "default"  # one of ROPE_KINDS
    factor: float | None = None  # how many times longer the context gets; yarn/longrope: None = max / original
    original_positions: int = 0  # the pre-training length (original_max_position_embeddings): llama3, yarn,
    #                              longrope (short factors up to it, long past it); dynamic: max_position_embeddings
    max_positions: int = 0  # max_position_embeddings (yarn's and longrope's factor when factor is None)
    attention_factor: float | None = None  # yarn, longrope: cos and sin times this; None: derived from factor
    beta_fast: float | None = None  # yarn's ramp: dimensions turning more than beta_fast times keep their frequency
    beta_slow: float | None = None  # ... fewer than beta_slow times are interpolated (divided by factor)
    mscale: float | None = None  # yarn: with mscale_all_dim, the attention factor's two log(factor) weights
    mscale_all_dim: float | None = None
    truncate: bool = True  # yarn: the ramp's ends rounded outwards to whole dimensions
    low_freq_factor: float = 1.0  # llama3: wavelengths over original / low_freq_factor are divided by factor
    high_freq_factor: float = 4.0  # llama3: those under original / high_freq_factor are kept; between: blended
    short_factor: tuple[float, ...] = ()  # longrope: one divisor per frequency, up to original_positions
    long_factor: tuple[float, ...] = ()  # longrope: the same past it
    proportion: float = 1.0  # proportional: the share of each head's frequencies that turn (the rest are 0)

    def __post_init__(self):  # a checkpoint's stored JSON gives lists
        object.__setattr__(self, "short_factor", tuple(self.short_factor))
        object.__setattr__(self, "long_factor", tuple(self.long_factor))

    def variant(self, seq_len: int):
        """Which frequencies serve a forward over positions 0..seq_len-1 (None: the fixed ones). LongRoPE
        takes its long factors once the sequence passes the original length, dynamic NTK recomputes its
        base from the length past max_position_embeddings, as transformers does for each forward."""
        if self.kind == "longrope":
            return "long" if seq_len > self.original_positions else "short"
        if self.kind == "dynamic" and seq_len > self.original_positions:
            return seq_len
        return None


ROPE_KINDS = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
PLAIN_ROPE = RopeScaling()


def _powers(dim: int, device=None) -> torch.Tensor:
    """2i / dim for i < dim / 2, as transformers makes them (an int64 arange turned float32)."""
    return torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim


def _yarn(dim: int, base: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    factor = s.factor if s.factor is not None else s.max_positions / s.original_positions

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.attention_factor
    if attention is None:
        attention = (float(mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim))
                      if s.mscale and s.mscale_all_dim else mscale(factor))

    def correction_dim(rotations):  # the dimension that turns `rotations` times over the original length
        return (dim * math.log(s.original_positions / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(s.beta_fast or 32), correction_dim(s.beta_slow or 1)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    keep = 1 - ramp  # 1: the frequency kept (extrapolated), 0: divided by factor (interpolated)
    inv = (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    return inv, attention


def _llama3(dim: int, base: float, s: RopeScaling) -> torch.Tensor:
    inv = 1.0 / (base ** _powers(dim))
    low_wavelen = s.original_positions / s.low_freq_factor
    high_wavelen = s.original_positions / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_inv_freq(dim: int, base: float, scaling: RopeScaling = PLAIN_ROPE,
                  seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies (dim / 2,), the factor on cos and sin) for `dim` rotated dimensions, computed
    step by step as transformers' ROPE_INIT_FUNCTIONS do (float32, on the CPU, as at its model's init), so
    that the tables agree bit for bit. seq_len: the current forward's length (dynamic and longrope only)."""
    s, kind = scaling, scaling.kind
    if kind == "default":
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    if kind == "linear":
        return 1.0 / (base ** _powers(dim)) / s.factor, 1.0
    if kind == "dynamic":
        top = s.original_positions  # max_position_embeddings
        if seq_len is None or seq_len <= top:  # at init: the plain frequencies, as Python floats compute them
            base = base * ((s.factor * top / top) - (s.factor - 1)) ** (dim / (dim - 2))
        else:  # in the forward: from the length, in float32 tensors
            n = torch.maximum(torch.tensor(seq_len), torch.tensor(top))
            base = base * ((s.factor * n / top) - (s.factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** _powers(dim)), 1.0
    if kind == "yarn":
        return _yarn(dim, base, s)
    if kind == "longrope":
        factor = s.factor if s.factor is not None else s.max_positions / s.original_positions
        attention = s.attention_factor
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(s.original_positions))
        long = seq_len is not None and seq_len > s.original_positions
        ext = torch.tensor(s.long_factor if long else s.short_factor, dtype=torch.float32)
        return 1.0 / (ext * base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), attention
    if kind == "llama3":
        return _llama3(dim, base, s), 1.0
    if kind == "proportional":  # Gemma 4's: the first share of frequencies over the whole head, then zeros
        angles = int(s.proportion * dim // 2)
        inv = 1.0 / (base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
        if dim // 2 > angles:
            inv = torch.cat((inv, torch.zeros(dim // 2 - angles, dtype=torch.float32)), dim=0)
        return inv / (s.factor if s.factor is not None else 1.0), 1.0
    raise ValueError(f"unknown rope type {kind!r} (known: {', '.join(ROPE_KINDS)})")


def rope_tables(n: int, head_dim: int, base: float = 10000.0, device=None, dtype=torch.float32,
                scaling: RopeScaling = PLAIN_ROPE, seq_len: int | None = None):
    """(cos, sin), each (n, head_dim), for rotary position embedding (Llama's half-split layout) at
    positions 0..n-1, with the frequencies `scaling` gives for a forward of seq_len tokens (default: n).
    Angles as transformers forms them (position times frequency in float32); cos and sin times the
    scaling's attention factor (YaRN, LongRoPE) before the cast to dtype."""
    inv, attention = rope_inv_freq(head_dim, base, scaling, n if seq_len is None else seq_len)
    inv = inv.to(device)
    ang = torch.arange(n, dtype=torch.float32, device=device)[:, None] * inv[None, :]  # (n, d/2)
    ang = torch.cat([ang, ang], dim=-1)  # (n, d)
    cos, sin = ang.cos(), ang.sin()
    if attention != 1.0:
        cos, sin = cos * attention, sin * attention
    return cos.to(dtype), sin.to(dtype)


ROPE_LAYOUTS = ("half", "pairs", "pairs_in")


def apply_rope(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor], layout: str = "half") -> torch.Tensor:
    """Rotate pairs of x (B, H, N, d) by each position's angle, r being the tables' width: r = d rotates every
    dimension; r < d (partial rotary, GPT-NeoX's rotary_pct) rotates the first r and passes the other d - r
    through unchanged.

    layout says which dimensions form pair i (rotated by frequency i):
      "half"      (x_i, x_{i+r/2}): Llama, Qwen, Gemma, and most (rotate_half);
      "pairs"     (x_2i, x_2i+1), and the result in the same interleaved order: GLM-4, Cohere, Llama 4;
      "pairs_in"  (x_2i, x_2i+1), the result in the "half" order (the first of each pair, then the second):
                  DeepSeek-V3's rope_interleave.
    The arithmetic is the same in every layout (x·cos + rotate(x)·sin); only where each pair lives differs."""
    cos, sin = tables
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], tables, layout), x[..., r:]], dim=-1)
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"unknown RoPE layout {layout!r}: use one of {', '.join(ROPE_LAYOUTS)}")
    if layout != "half":  # the pairs' first members, then their second ones
        x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
    half = x.shape[-1] // 2
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # rotate_half, for autograd
        out = x * cos + rotated * sin
    else:
        out = _rotate(x, cos, sin, half)
    if layout == "pairs":  # back to (first, second) side by side
        out = out.unflatten(-1, (2, half)).transpose(-1, -2).flatten(-2)
    return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin, transformers' sum, without rotate_half's negated copy and cat (issue 24 A): x·cos
    whole, then each half's sin term added in place, (-x2)·sin1 as -(x2·sin1) (a negation is exact and rounding
    symmetric), so every element is the same two rounded products and one rounded sum, bit for bit."""
    out = torch.mul(x, cos)
    term = torch.mul(x[..., half:], sin[..., :half])
    out[..., :half].sub_(term)
    torch.mul(x[..., :half], sin[..., half:], out=term)
    out[..., half:].add_(term)
    return out
