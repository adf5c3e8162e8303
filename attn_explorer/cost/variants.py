"""The attention variants the cost lab measures: one registry for the CLI, the Cost page and the guard.

Each `Variant` carries what every reader needs: its name and label, its colour on the plots, a
one-line blurb, whether it is exact, how its work grows with n (for the time estimate), the
keyword arguments it takes from a `SweepConfig`, its kernel in `core.efficient`, and the memory
guard's prediction of the bytes one call builds.

No torch here: the CLI imports this on every start and the GUI sizes its slider with it. The kernel
is looked up in `core.efficient` only when a measurement asks for it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from attn_explorer.cost.memory import elem_bytes


def chunked_q_block(n: int) -> int:
    """core.efficient.auto_q_block, repeated here so predicting needs no torch (a test keeps them equal)."""
    return min(1024, max(128, n // 32))


# --- the memory guard's formulas: bytes of tensors one call builds, counted generously -----------
# T = batch·heads rows of work; x = one (B, H, n, d_k) tensor; e = bytes per element. Inputs excluded.


def _naive_bytes(n: int, cfg: Any, T: int, x: int, e: int) -> int:
    # scaled q, scores, probabilities, output (+ the causal bool grid)
    return 2 * T * n * n * e + 2 * x + (n * n if cfg.causal else 0)


def _chunked_bytes(n: int, cfg: Any, T: int, x: int, e: int) -> int:
    # output + one q block, its accumulator and 2 score tiles, + per-row statistics
    qb = min(chunked_q_block(n) if cfg.q_block is None else cfg.q_block, n)
    kb = min(cfg.k_block, n)
    return x + T * (2 * qb * cfg.d_k + 2 * qb * kb + 8 * qb) * e + (qb * kb if cfg.causal else 0)


def _window_bytes(n: int, cfg: Any, T: int, x: int, e: int) -> int:
    # padded q/k/v copies, scores and probabilities per window, output
    w = max(1, min(cfg.window, n))
    n_pad = math.ceil(n / w) * w
    xp = T * n_pad * cfg.d_k * e
    return 4 * xp + 2 * T * n_pad * w * e + w * w


def _linear_bytes(n: int, cfg: Any, T: int, x: int, e: int) -> int:
    # φ(q), φ(k), their temporaries, numerator, output; the d×d state (+ causal chunk blocks)
    return 5 * x + T * (cfg.d_k * cfg.d_k + 2 * n) * e + (T * 128 * 128 * e * 2 if cfg.causal else 0)


def _sdpa_bytes(n: int, cfg: Any, T: int, x: int, e: int) -> int:
    # output, log-sum-exp, and per-thread tiles inside the kernel
    return 2 * x + T * n * 4 + 64 * 2**20


@dataclass(frozen=True)
class Variant:
    """One way to compute attention, as the cost lab shows and measures it."""

    name: str  # the key everywhere: CLI --impl, JSON "impl", the page's boxes
    label: str  # a short human name
    colour: str  # its colour on the plots
    blurb: str  # one line: what it does and what it costs
    exact: bool  # gives exact attention's answer (up to rounding)
    growth: float  # exponent of its work in n, for the time estimate: 2 (n²) or 1 (n)
    options: tuple[str, ...]  # SweepConfig fields it takes as keyword arguments
    _bytes: Callable[[int, Any, int, int, int], int]  # the guard's formula, see above

    @property
    def kernel(self) -> Callable[..., Any]:
        """The function in core.efficient: fn(q, k, v, causal=False, **options) -> output."""
        from attn_explorer.core import efficient

        return getattr(efficient, self.name)

    def kwargs(self, cfg: Any) -> dict:
        """The keyword arguments this variant takes from a SweepConfig."""
        return {opt: getattr(cfg, opt) for opt in self.options}

    def call_bytes(self, n: int, cfg: Any) -> int:
        """Bytes of tensors one call builds at length n (an upper bound); inputs not included."""
        e = elem_bytes(cfg.dtype)
        T = cfg.batch * cfg.heads
        return int(self._bytes(n, cfg, T, T * n * cfg.d_k * e, e))


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("naive", "naive (exact)", "#e45756", "the whole n×n softmax, built in memory (the reference)",
            True, 2.0, (), _naive_bytes),
    Variant("chunked", "chunked (FlashAttention-style)", "#4c78a8",
            "FlashAttention's tiles and online softmax, in PyTorch: exact, no n×n matrix",
            True, 2.0, ("q_block", "k_block"), _chunked_bytes),
    Variant("window", "window", "#54a24b", "each token sees only its window of w tokens (Swin): O(n·w), approximate",
            False, 1.0, ("window",), _window_bytes),
    Variant("linear", "linear", "#b279a2", "φ(q)(φ(k)ᵀv) with φ = elu + 1: O(n·d²), approximate",
            False, 1.0, (), _linear_bytes),
    Variant("sdpa", "SDPA (torch)", "#f58518", "torch's fused scaled_dot_product_attention, for reference",
            True, 2.0, (), _sdpa_bytes),
)}
NAMES: tuple[str, ...] = tuple(VARIANTS)
REFERENCES = ("naive", "sdpa")  # exact variants an error can be measured against, in preference order


def get(name: str) -> Variant:
    """The variant called `name`; ValueError naming the choices otherwise."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}: choose from {', '.join(NAMES)}") from None


def point_bytes(name: str, n: int, cfg: Any) -> tuple[int, int]:
    """(bytes one call needs, bytes the whole point needs). The point also holds q, k and v, the
    kept reference output and this call's output: five (B, H, n, d_k) tensors."""
    call = get(name).call_bytes(n, cfg)
    x = cfg.batch * cfg.heads * n * cfg.d_k * elem_bytes(cfg.dtype)
    return call, call + 5 * x


def fits(name: str, n: int, cfg: Any, budget: int) -> bool:
    """Does measuring `name` at n stay within `budget` bytes?"""
    return point_bytes(name, n, cfg)[1] <= budget
