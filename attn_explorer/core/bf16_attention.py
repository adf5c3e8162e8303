"""Exact attention in bfloat16 products on a CPU that multiplies bfloat16 natively (issue 24 B).

torch's CPU flash kernel runs a bfloat16 model's attention at float32 speed (measured on an AMD EPYC with
avx512_bf16: 0.49 s against 0.49 s for one causal head group at 4,096 tokens, d 256), while a bfloat16
product runs 2-3× faster than a float32 one. This kernel does what transformers' eager bfloat16 attention
does, in query blocks against each block's visible key range only:

- the logits are one bfloat16 product (q·kᵀ accumulated in float32, times the scale, rounded once to
  bfloat16: eager rounds twice, after the product and after the scale);
- the softmax is float32 (`softmax(..., dtype=float32)`, as eager), and so is each row's log-sum-exp, taken
  from it exactly: lse = max + log Σ exp(s - max) = max - log p_max;
- the probabilities are rounded to bfloat16 for the product with v (as eager's `.to(query.dtype)`).

Grouped-query heads share their k and v without a copy: a key-value head's r query heads are stacked as
r·rows rows of one product. The causal triangle and a sliding window are applied as one bool tile per
block shape, made once per layer; a tile that the mask does not cut takes none. A row never sees nothing
here (callers route masks, chunks and more queries than keys elsewhere).

Where it pays (`pays`, issue 24 B: measured per layer kind, 2 threads, one causal head group of 4 query heads
on 1 key-value head, d 256): on a CPU with avx512_bf16 and no AMX (an AMD EPYC) torch's flash kernel runs bfloat16
at float32 speed, and this kernel took a sliding-window layer (window 512) in 0.4-0.5× its time, but lost on the
long global layers (8,192 tokens: 1.06 s against 0.86 s; 32,768: 18.0 s against 14.4 s), where its float32 softmax
tile leaves the cache. On a CPU with AMX (an Intel Xeon) the flash kernel multiplies bfloat16 in AMX tiles and won
on every shape: global layers 0.035 s against 0.166 s at 4,096 tokens, window layers 0.50 s against 0.59 s at
32,768. So by default the kernel takes sliding-window layers on a CPU without AMX, and nothing else.

The error this adds against float32 attention on the same bfloat16 q, k and v is that of the logits'
rounding, at most 2⁻⁸ of each logit (bfloat16's unit roundoff): what eager bfloat16 has. `tests/core/test_bf16_attention.py` states it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attn_explorer.core.bf16 import amx_bf16
from attn_explorer.core.progress import check as _check_stop

ROW_BLOCK = 256  # query rows a block (global layers); fewer when the keys are many
WINDOW_BLOCK = 128  # a sliding window's blocks: each sees rows + window - 1 keys, so short blocks waste little
NEG = float("-inf")
TILE = 1 << 24  # logits a block at most (r·rows·keys), about 32 MB in bfloat16 and 64 MB as float32
# A causal layer's blocks see ever more keys; oneDNN compiles one kernel per product shape (about 1.5 MB each:
# 512 shapes grew the process by 750 MB here), so a block's key range is rounded up to a multiple of this, the
# keys past the diagonal masked (k and v padded once per layer where the last block needs it)
KEY_BUCKET = 512
# "auto": where it pays (pays()); "always": every call usable() allows (tests, benchmarks); "never": torch's kernel
MODE = "auto"


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, chunk, softcap) -> bool:
    """Whether this kernel takes the call: bfloat16 q, k, v on the CPU, no autograd, no mask, no attention
    chunks, no soft-capping, and no more queries than keys. (Whether the CPU multiplies bfloat16 natively is
    the caller's test: core.bf16.native_bf16.)"""
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.bfloat16 and not grad
            and mask is None and chunk is None and softcap is None and q.shape[-2] <= k.shape[-2])


def pays(window: int | None, causal: bool) -> bool:
    """Whether this kernel is the faster one for a layer of this kind on this CPU (the module docstring's
    measurements), as MODE says: by default a causal sliding-window layer on a CPU without AMX."""
    if MODE != "auto":
        return MODE == "always"
    return causal and window is not None and not amx_bf16()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
              window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (B, H, N, d_v) bfloat16, lse (B, H, N) float32). q (B, H, N, d); k, v (B, H_kv, M, d), not
    repeated. causal aligns query i with key i + M - N; window: query i sees keys in (i + M - N - window, i + M - N]."""
    B, H, N, d = q.shape
    Hkv, M, dv = k.shape[1], k.shape[2], v.shape[-1]
    r = H // Hkv
    off = M - N
    k3, v3 = k.reshape(B * Hkv, M, d), v.reshape(B * Hkv, M, dv)
    bucket = causal and window is None
    mp = -(-M // KEY_BUCKET) * KEY_BUCKET if bucket else M
    if mp > M:  # room for the last block's rounded-up range: keys that every row of it masks
        k3, v3 = F.pad(k3, (0, 0, 0, mp - M)), F.pad(v3, (0, 0, 0, mp - M))
    k3 = k3.transpose(1, 2)  # (BH_kv, d, M'): a view
    out = q.new_empty(B, Hkv, r, N, dv)  # = (B, H, N, d_v) with head g·r + j
    lse = torch.empty(B, Hkv, r, N, dtype=torch.float32, device=q.device)
    zero = q.new_zeros(1, 1, 1)  # baddbmm's ignored addend (beta = 0): the scale rides in the product
    rb = WINDOW_BLOCK if (causal and window is not None) else ROW_BLOCK
    keys = M if not causal else min(M, (window or M) + rb)
    rb = max(16, min(rb, TILE // max(1, r * keys)))
    shut: dict = {}  # block shape -> where the band hides a key (and "far": the causal triangle's far side)
    for a in range(0, N, rb):
        _check_stop()  # issue 24 D: a stop asked by the caller ends the forward between blocks
        b = min(N, a + rb)
        rows = b - a
        c0 = 0 if not causal or window is None else max(0, a + off - window + 1)
        c1 = M if not causal else min(M, b + off)
        if bucket:
            c1 = min(mp, -(-c1 // KEY_BUCKET) * KEY_BUCKET)
        qb = q[:, :, a:b].reshape(B * Hkv, r * rows, d)  # r heads' rows stacked: one product per k head
        s = torch.baddbmm(zero, qb, k3[:, :, c0:c1], beta=0, alpha=scale)  # (BH_kv, r·rows, c) bfloat16
        if bucket:  # row i of the block sees keys up to a + off + i: mask the triangle's far side only
            z = a + off
            if z + 1 < c1:
                s.view(B * Hkv, r, rows, c1)[..., z:].masked_fill_(_far_side(shut, rows, c1 - z, q.device), NEG)
        elif causal:
            cut = _cut(shut, rows, c1 - c0, a + off - c0, window, q.device)
            if cut is not None:
                s.view(B * Hkv, r, rows, c1 - c0).masked_fill_(cut, NEG)
        p = torch.softmax(s, dim=-1, dtype=torch.float32)  # as eager: the softmax in float32
        top = s.amax(dim=-1).float()  # each row's largest logit (exact: a max of bfloat16 numbers)
        lse[:, :, :, a:b] = (top - p.amax(dim=-1).log_()).view(B, Hkv, r, rows)  # p_max = exp(top - lse)
        out[:, :, :, a:b] = torch.bmm(p.to(torch.bfloat16), v3[:, c0:c1]).view(B, Hkv, r, rows, dv)
        del s, p
    return out.view(B, H, N, dv), lse.view(B, H, N)


def rounded_product(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """scale · a @ b rounded once to bfloat16, as attention() forms its logits: (…, r, d) @ (…, d, c)."""
    lead = a.shape[:-2]
    a3, b3 = a.reshape(-1, *a.shape[-2:]), b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    zero = a.new_zeros(1, 1, 1)
    return torch.baddbmm(zero, a3, b3, beta=0, alpha=scale).view(*lead, a.shape[-2], b.shape[-1])


def _far_side(cache: dict, rows: int, cols: int, device) -> torch.Tensor:
    """bool (rows, cols), True where column j > row i: a view of one triangle kept for the layer."""
    tri = cache.get("far")
    if tri is None or tri.shape[0] < rows or tri.shape[1] < cols:
        tri = cache["far"] = torch.ones(rows, max(cols, rows + KEY_BUCKET), dtype=torch.bool, device=device).triu_(1)
    return tri[:rows, :cols]


def _cut(cache: dict, rows: int, cols: int, diag: int, window: int | None, device) -> torch.Tensor | None:
    """bool (rows, cols), True where a block's row a cannot see key b (b > a + diag, or b ≤ a + diag - window);
    None where it sees every key. Made once per block shape and kept for the layer."""
    key = (rows, cols, diag)
    if key not in cache:
        hidden = cols - 1 > diag or (window is not None and diag + rows - 1 - window >= 0)
        if not hidden:
            cache[key] = None
        else:
            ok = torch.ones(rows, cols, dtype=torch.bool, device=device).tril_(diag)
            if window is not None:
                ok.triu_(diag - window + 1)
            cache[key] = None if bool(ok.all()) else ~ok
    return cache[key]
