"""Explanation rules for the backward pass (a subset of AttnLRP, Achtibat et al. 2024, ICML).

Layer-wise relevance propagation can be run as "gradient × input" with some layers' gradients changed.
Inside `lrp_rules()` (this thread only: a context variable) the modules below change their backward
pass and nothing else: every forward value stays what it was, to rounding.

- Uniform rule (AttnLRP's rule for a product of two inputs): each operand of q·kᵀ, of A·V and of
  the gated MLP's act(gate)·up gets half the gradient, so each takes half of the product's relevance.
- Identity rule for normalisation (LayerNorm, RMSNorm; Ali et al. 2022, kept by AttnLRP): the
  divisor (σ or the RMS) is held constant, so the norm is linear in its input.
- Identity rule for element-wise activations (GELU, SiLU): the gradient becomes act(x) / x, so the
  relevance passes through unchanged.

Softmax needs no change: AttnLRP's rule R_in = x ⊙ (R_out − s Σ R_out) is, in gradient × input
form, the softmax's own gradient. Linear layers keep their gradient (the ε-rule as ε → 0, biases
absorbing their share). Not covered: Gemma 2's logit soft-cap (tanh) keeps its true gradient.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch

_ACTIVE = contextvars.ContextVar("attn_explorer_lrp_rules", default=False)


@contextmanager
def lrp_rules():
    """Run the block inside with the rules above on the backward pass (the forward is unchanged)."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    """Whether the rules apply now (inside lrp_rules, with autograd recording)."""
    return _ACTIVE.get() and torch.is_grad_enabled()


class _HalfGrad(torch.autograd.Function):
    """Forward: x itself. Backward: half the gradient (the uniform rule's share for one operand)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return 0.5 * g


def half_grad(x: torch.Tensor) -> torch.Tensor:
    """x, with half the gradient flowing back through it when the rules are active."""
    return _HalfGrad.apply(x) if active() and x.requires_grad else x


def act_rule(fn, x: torch.Tensor) -> torch.Tensor:
    """fn(x); with the rules active its gradient is fn(x) / x (0 where x is 0), the identity rule."""
    y = fn(x)
    if not (active() and x.requires_grad):
        return y
    ratio = torch.where(x != 0, y / torch.where(x != 0, x, torch.ones_like(x)), torch.zeros_like(x)).detach()
    return y.detach() + (x - x.detach()) * ratio


def norm_scale(scale: torch.Tensor) -> torch.Tensor:
    """A norm's 1/σ (or 1/RMS): held constant on the backward pass when the rules are active."""
    return scale.detach() if active() else scale
