"""Norms and MLPs: LayerNorm, RMSNorm (per head or over all heads), the GELU / tanh-GELU MLP and SwiGLU."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.explain import act_rule, active, half_grad, norm_scale
from attn_explorer.core.linear import Linear


# Issue 24 A: a long input's RMSNorm runs this many rows at a time (their float32 tensors in the cache). Measured at
# 16,384 tokens, Gemma 3 270M's shapes, bfloat16, glibc keeping freed blocks (core.heap): a block norm 23.2 ->
# 16.4 ms, a q norm 38.6 -> 27.0 ms; at 4,096 tokens 5.8 -> 5.0 ms; 256 or 4,096 rows at a time gained less.
NORM_BLOCK_ROWS = 1024


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Llama): no centring, no bias.

    unit_offset=True multiplies by (1 + weight) instead, in float32 (Gemma): the stored weight is
    the change from 1, and a zero weight leaves the normalised x as it is."""

    def __init__(self, dim: int, eps: float = 1e-6, unit_offset: bool = False):
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return self._steps_in_place(x)
        if not active():  # issue 24 A: torch's rms_norm (same numbers as the steps below: float32 statistics, rounded
            # once; max |diff| 0 in float32 and bfloat16). Fused on GPUs; on the CPU torch 2.13 runs it as the same
            # steps (pow, mean, rsqrt, mul), a new tensor for each, so the CPU takes _steps_in_place above
            shape = x.shape[-1:]
            if self.unit_offset:  # Gemma: normalised and times (1 + w) in float32, then cast
                return F.rms_norm(x.float(), shape, 1.0 + self.weight.float(), self.eps).to(x.dtype)
            if x.dtype == self.weight.dtype == torch.float32:
                return F.rms_norm(x, shape, self.weight, self.eps)
            return self.weight * F.rms_norm(x, shape, None, self.eps)  # Llama: rounded to x's dtype, then w
        dtype = x.dtype
        x = x.float()
        x = x * norm_scale(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        if self.unit_offset:
            return (x * (1.0 + self.weight.float())).to(dtype)
        return self.weight * x.to(dtype)

    def _steps_in_place(self, x: torch.Tensor) -> torch.Tensor:
        """The steps above (transformers' own), each into one float32 tensor of this call's own (issue 24 A: on the
        CPU, where torch's rms_norm runs as these steps with a new tensor for each): the same numbers. From
        2 · NORM_BLOCK_ROWS rows (dim -2: tokens, also for the q and k norms' (B, H, N, d) view), a block of rows
        at a time into one output, so the float32 tensors stay in the cache: each row's numbers are its own."""
        n = x.shape[-2] if x.dim() >= 2 else 0
        if n < 2 * NORM_BLOCK_ROWS or not (self.unit_offset or x.dtype == self.weight.dtype):
            return self._steps(x)
        out = torch.empty_like(x)  # x's dtype and strides, as the whole steps give
        for i in range(0, n, NORM_BLOCK_ROWS):
            self._steps(x[..., i:i + NORM_BLOCK_ROWS, :], out[..., i:i + NORM_BLOCK_ROWS, :])
        return out

    def _steps(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The steps on x, their result new or written into `out` (x's dtype; its cast is the same rounding)."""
        y = x.float()
        scale = y.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        y = y * scale if y is x else y.mul_(scale)  # x itself (float32 already) is not ours to change
        if self.unit_offset:  # times (1 + w) in float32, then rounded to x's dtype (torch.mul(..., out=) of
            # another dtype computes into a float32 tensor and copies it over: no pass saved)
            y = y.mul_(1.0 + self.weight.float())
            return y.to(x.dtype) if out is None else out.copy_(y)
        if x.dtype == self.weight.dtype:  # Llama: rounded to x's dtype, then times w
            return (y.to(x.dtype) if out is None else out.copy_(y)).mul_(self.weight)
        return self.weight * y.to(x.dtype)


def unit_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, in float32, with no weight (Llama 4's q and k
    "L2Norm", which divides by the RMS, not the length)."""
    y = x.float()
    return (y * norm_scale(torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


class HeadsRMSNorm(RMSNorm):
    """An RMSNorm over every head's q (or k) together: (B, H, N, d_k) in and out, normalised over H·d_k
    as one vector, as OLMo 2 normalises q_proj's whole output before the head split."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, N, d = x.shape
        y = super().forward(x.transpose(1, 2).reshape(B, N, H * d))
        return y.view(B, N, H, d).transpose(1, 2)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (the same parameters and state_dict); inside core.explain.lrp_rules its 1/σ is held
    constant on the backward pass (the identity rule), the forward value unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not active():
            return super().forward(x)
        xc = x - x.mean(-1, keepdim=True)
        y = xc * norm_scale(torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + self.eps))
        if self.weight is not None:
            y = y * self.weight
        return y + self.bias if self.bias is not None else y


class FloatLayerNorm(LayerNorm):
    """A LayerNorm computed in float32 step by step (the mean, then the centred variance), its weight applied
    in float32 before the cast back, as transformers' Cohere and Cohere 2 compute theirs (the same numbers)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        xc = x - x.mean(-1, keepdim=True)
        y = xc * norm_scale(torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + self.eps))
        if self.weight is not None:
            y = self.weight.float() * y
        return (y if self.bias is None else y + self.bias.float()).to(dtype)


class PerHeadLayerNorm(nn.Module):
    """A bias-free float32 LayerNorm of each head's q (or k) over d_k, with a weight of its own per head
    (H, d_k): (B, H, N, d_k) in and out (Command R+'s q_norm and k_norm, use_qk_norm). `head(h)` is head h's
    norm alone, a FloatLayerNorm (what the why-matrix freezes)."""

    def __init__(self, heads: int, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        xc = x - x.mean(-1, keepdim=True)
        y = xc * norm_scale(torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + self.eps))
        return (self.weight.float()[:, None, :] * y).to(dtype)

    def head(self, h: int) -> "FloatLayerNorm":
        norm = FloatLayerNorm(self.weight.shape[1], eps=self.eps, bias=False).to(self.weight.device)
        with torch.no_grad():
            norm.weight.copy_(self.weight[h])
        return norm


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    if kind == "layer":
        return LayerNorm(dim, eps=eps)
    if kind == "rms":
        return RMSNorm(dim, eps=eps)
    if kind == "rms1p":  # Gemma's (1 + weight) RMSNorm
        return RMSNorm(dim, eps=eps, unit_offset=True)
    if kind == "layer_nobias":  # a LayerNorm with a weight and no bias (Cohere, Command R)
        return FloatLayerNorm(dim, eps=eps, bias=False)
    raise ValueError(f"unknown norm {kind!r}: use 'layer', 'layer_nobias', 'rms' or 'rms1p'")


ACTIVATIONS = {
    "gelu": F.gelu,  # exact, erf-based (BERT, ViT)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's gelu_new
    "relu": F.relu,
    "silu": F.silu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # CLIP's x·σ(1.702x)
}


# The same functions written into their input (issue 24 A: no second (N, hidden) tensor), the same numbers.
INPLACE_ACTIVATIONS = {
    "gelu": lambda x: torch.ops.aten.gelu_(x),
    "gelu_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda x: F.silu(x, inplace=True),
    "quick_gelu": lambda x: x.mul_(torch.sigmoid(1.702 * x)),
}
# by the function an MLP holds as its `act` (one set in its place, e.g. by a test, has none: the plain steps run)
_IN_PLACE = {ACTIVATIONS[name]: fn for name, fn in INPLACE_ACTIVATIONS.items()}


# The same functions as oneDNN post-ops, applied inside the product on the fast path (core.linear).
FUSED_ACTIVATIONS = {
    "gelu": ("gelu", "none"),  # erf
    "gelu_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}


def activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; supported: {', '.join(ACTIVATIONS)}") from None


class MLP(nn.Module):
    """fc2(act(fc1(x))): the position-wise feed-forward network."""

    def __init__(self, dim: int, hidden: int, act: str = "gelu", bias: bool = True):
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=bias)
        self.fc2 = Linear(hidden, dim, bias=bias)
        self.act = activation(act)
        self.fused_act = FUSED_ACTIVATIONS.get(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = None if self.fused_act is None else self.fc1.packed(x, post=self.fused_act)
        if h is not None:
            return self.fc2(h)
        h = self.fc1(x)
        act_ = _IN_PLACE.get(self.act)
        if act_ is not None and not (torch.is_grad_enabled() and h.requires_grad):
            return self.fc2(act_(h))  # fc1's own new tensor: the activation in place (issue 24 A)
        return self.fc2(act_rule(self.act, h))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (Llama); act="gelu_tanh" gives GeGLU (Gemma).
    fused=True keeps gate and up as one (dim -> 2*hidden) projection `gate_up`, the gate's rows first (Phi-3)."""

    def __init__(self, dim: int, hidden: int, bias: bool = False, act: str = "silu", fused: bool = False):
        super().__init__()
        if fused:
            self.gate_up = Linear(dim, 2 * hidden, bias=bias)
        else:
            self.gate = Linear(dim, hidden, bias=bias)
            self.up = Linear(dim, hidden, bias=bias)
        self.fused = fused
        self.down = Linear(hidden, dim, bias=bias)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate(x), self.up(x)
        act_ = _IN_PLACE.get(self.act)
        if act_ is not None and not (torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad)):
            # gate: the product's own new tensor, so act in place, and * too where gate is a whole tensor (fused: a
            # strided half, and down's product could round otherwise on a strided input: a new one as before)
            return self.down(act_(gate) * up if self.fused else act_(gate).mul_(up))
        return self.down(half_grad(act_rule(self.act, gate)) * half_grad(up))  # explain's rules: no-ops otherwise


class LayerScale(nn.Module):
    """Per-channel learned scale on a residual branch (CaiT, DINOv2)."""

    def __init__(self, dim: int, init: float = 1.0):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.lambda1
