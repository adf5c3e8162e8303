"""bfloat16 products where the CPU runs them natively (issue 24 B and E), with float32 statistics kept exact.

On a CPU with AVX512-BF16 or AMX-BF16, oneDNN multiplies bfloat16 matrices with float32 accumulation several
times faster than float32 ones (measured 3.4× here, AMD EPYC with avx512_bf16, 4096 × 640 × 2048; the
issue's Intel with AMX 4.7×). Where it cannot, torch converts, and float32 is as fast or faster.

`log_probs_bf16` is a lazy tile's log-probabilities, log p = scale·q·k − lse, as one bfloat16 product: q and k
are the model's own bfloat16 numbers (no rounding there), and −lse/scale rides along as two extra columns, a
high and a low bfloat16 part (lse to about 2^-16 of itself), so the product's float32 sum is the
log-probability itself and only that is rounded to bfloat16 (8 significant bits): |Δ log p| ≤ 2^-8 |log p|,
so |Δp| ≤ 2^-8 · p·|ln p| ≤ 2^-8 / e ≈ 1.4e-3 absolute, and 0.4 % of p wherever p ≥ 1/e (measured: 1.42e-3
and 0.2 % on a random causal head at 4,096 tokens, d 256).
"""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict:
    """The first CPU's fields in /proc/cpuinfo (flags, vendor_id, ...), read once (empty where there is none)."""
    fields: dict = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def _cpu_flags() -> frozenset:
    """The CPU's flags from /proc/cpuinfo (empty where there is none)."""
    return frozenset(_cpuinfo().get("flags", "").split())


def cpu_vendor() -> str:
    """"GenuineIntel", "AuthenticAMD", ... from /proc/cpuinfo; elsewhere what platform.processor() names
    ("GenuineIntel" when it says Intel, as on Windows), or ""."""
    vendor = _cpuinfo().get("vendor_id", "")
    if not vendor:
        import platform

        vendor = "GenuineIntel" if "intel" in platform.processor().lower() else ""
    return vendor


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (avx512_bf16 or amx_bf16 in /proc/cpuinfo)."""
    return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())


def amx_bf16() -> bool:
    """Whether this CPU has AMX tiles for bfloat16 (amx_bf16), which torch's CPU flash kernel uses: there it runs
    a bfloat16 attention about 3× faster than float32 (issue 24 B, core.bf16_attention.pays)."""
    return "amx_bf16" in _cpu_flags()


def log_probs_bf16(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, scale: float) -> torch.Tensor:
    """scale · q @ k.T − lse[:, None], (r, c) float32, from one bfloat16 product. q (r, d) and k (c, d) bfloat16;
    lse (r,) float32 (dead rows already 0)."""
    from attn_explorer.core.tiles import Bf16Tiles

    return Bf16Tiles(q, k, lse, scale).log_probs(slice(0, q.shape[0]), slice(0, k.shape[0]))
