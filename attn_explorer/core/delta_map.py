"""Gated DeltaNet's implicit map from the per-token quantities alone (core.deltanet.KeptDeltaNet's views), in float64.

The map is the delta rule run on one-hot values (core.recurrent derives it): the state U (d_k × width) has one column
per source token s, U[:, s] = β_s · (the transitions since s) k_s, and row t of the map is q_tᵀ U_t. Computed
chunk by chunk (chunked_delta_rule's UT form, the values one-hot):

- per chunk of C = 64 tokens (`_chunk_ops`): rows = P·U + Qu and U' = M·U + Ru, the last terms only in the chunk's
  own columns (u = T⁻¹ diag(β) is zero elsewhere): P = e^G q − inner·w, M = e^{G_last} I − kdᵀ·w, Qu = inner·u,
  Ru = kdᵀ·u (C × d_k, d_k × d_k, C × C, d_k × C);
- per block of L tokens (`_blocks`, L a multiple of C): those chained, so that the block's rows are P'·U + own and
  U' = M'·U + R' with U the state before the block: P' (L × d_k), M' (d_k × d_k), the block's own triangle
  own (L × L) and R' (d_k × L), from a local state [own columns | I] carried through the block's chunks;
- across blocks (`_scan`): U grows a block of columns at a time; the columns of tokens not yet read are exactly 0,
  so a product P'·U over any column range is right up to the block's start, and `own` lies over the rest.

So a band of L rows costs one (L × d_k) · (d_k × columns) product and U one (d_k × d_k) step per block: the work a
softmax head's pooled view spends on its logits. Everything stays float64 (the products write into buffers made
once: a fresh multi-megabyte tensor a band costs more in page faults than the product), and the columns a band
cannot reach are never computed. `map_bands` yields the map a band of rows at a time; `pool_map` pools it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 256  # L: the rows of a pooled view's band (a multiple of the chunk)
TILE = 1024  # the columns of a pooled view's band computed at once (256 × 1,024 float64: 2 MB)


def _chunk_ops(q, k, g, beta, a: int, length: int, chunk: int):
    """P (…, m, C, d_k), M (…, m, d_k, d_k), Qu (…, m, C, C), Ru (…, m, d_k, C) for the m = length / C chunks from
    token a (past the last token, padding that neither reads nor writes), float64."""
    *lead, N, dk = q.shape
    b = min(N, a + length)
    pad = length - (b - a)
    m = length // chunk
    qc, kc = (F.pad(t[..., a:b, :].double(), (0, 0, 0, pad)).reshape(*lead, m, chunk, dk) for t in (q, k))
    gc, bc = (F.pad(t[..., a:b].double(), (0, pad)).reshape(*lead, m, chunk) for t in (g, beta))
    G = gc.cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(upper, float("-inf")).exp()
    kb = kc * bc[..., None]
    T = (kb @ kc.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(T, torch.diag_embed(bc), upper=False, unitriangular=True)  # (.., C, C)
    w = torch.linalg.solve_triangular(T, kb * G.exp()[..., None], upper=False, unitriangular=True)
    inner = (qc @ kc.transpose(-1, -2)) * decay
    kdT = (kc * (G[..., -1:] - G).exp()[..., None]).transpose(-1, -2)
    P = qc * G.exp()[..., None] - inner @ w
    M = G[..., -1].exp()[..., None, None] * torch.eye(dk, dtype=torch.float64, device=q.device) - kdT @ w
    return P, M, inner @ u, kdT @ u


def _blocks(q, k, g, beta, a: int, count: int, L: int, chunk: int):
    """For `count` blocks of L tokens from token a: P' (…, count, L, d_k), M' (…, count, d_k, d_k), own
    (…, count, L, L) and R' (…, count, d_k, L) (module docstring), float64."""
    *lead, N, dk = q.shape
    K = L // chunk
    P, M, Qu, Ru = (t.reshape(*lead, count, K, *t.shape[-2:])
                    for t in _chunk_ops(q, k, g, beta, a, count * L, chunk))
    local = q.new_zeros(*lead, count, dk, L + dk, dtype=torch.float64)  # [own columns | the identity, moved on]
    local[..., L:] = torch.eye(dk, dtype=torch.float64, device=q.device)
    rows = q.new_zeros(*lead, count, L, L + dk, dtype=torch.float64)
    for c in range(K):
        r, seen = slice(c * chunk, (c + 1) * chunk), c * chunk
        done = torch.cat([local[..., :seen], local[..., L:]], dim=-1)  # the columns so far and the identity's
        out = P[..., c, :, :] @ done
        rows[..., r, :seen], rows[..., r, L:] = out[..., :seen], out[..., seen:]
        rows[..., r, seen:seen + chunk] = Qu[..., c, :, :]
        new = M[..., c, :, :] @ done
        local[..., :seen], local[..., L:] = new[..., :seen], new[..., seen:]
        local[..., seen:seen + chunk] = Ru[..., c, :, :]
    return rows[..., L:], local[..., L:], rows[..., :L], local[..., :L]


def _scan(q, k, g, beta, s0: int, width: int, stop: int, L: int, chunk: int, group: int = 16):
    """Yield (a, P', own, Uᵀ) for each block of L tokens from token s0 while a < stop: Uᵀ (…, width, d_k) the one-hot
    state, transposed (a column range is a row range: contiguous), over the columns of tokens s0..s0 + width - 1
    before token a (rows from a - s0 on are 0); P' and own the block's (…, L, d_k) and (…, L, L). Uᵀ is moved on
    in place when the caller asks for the next block."""
    *lead, N, dk = q.shape
    Ut = q.new_zeros(*lead, width, dk, dtype=torch.float64)
    spare = torch.zeros_like(Ut)
    blocks = -(-(stop - s0) // L)
    for j0 in range(0, blocks, group):
        count = min(group, blocks - j0)
        Pp, Mp, own, Rp = _blocks(q, k, g, beta, s0 + j0 * L, count, L, chunk)
        for i in range(count):
            lo = (j0 + i) * L
            yield s0 + lo, Pp[..., i, :, :], own[..., i, :, :], Ut
            seen = min(lo, width)
            if lead:
                spare[..., :seen, :] = Ut[..., :seen, :] @ Mp[..., i, :, :].transpose(-1, -2)
            else:
                torch.matmul(Ut[:seen], Mp[i].T, out=spare[:seen])
            hi = min(width, lo + L)
            if hi > lo:
                spare[..., lo:hi, :] = Rp[..., i, :, :hi - lo].transpose(-1, -2)
            Ut, spare = spare, Ut


def map_bands(q, k, g, beta, rows: slice, cols: slice, block: int = 1 << 20, chunk: int = 64):
    """Yield (t0, t1, A[..., t0:t1, cols]) in row order, bands covering `rows`, from the per-token quantities alone
    (about `block` entries a band, a multiple of the chunk, at most BLOCK rows): O(d_k · len(cols)) state, float64,
    exact."""
    s0, s1, t0, t1 = cols.start, cols.stop, rows.start, rows.stop
    *lead, _, dk = q.shape
    width = s1 - s0
    L = max(chunk, min(BLOCK, block // max(1, width) // chunk * chunk))
    for a in range(t0, min(t1, s0), L):  # the rows before the first column's token (or all, above the diagonal)
        yield a, min(t1, s0, a + L), q.new_zeros(*lead, min(t1, s0, a + L) - a, width, dtype=torch.float64)
    if t1 <= s0:
        return
    for a, Pp, own, Ut in _scan(q, k, g, beta, s0, width, t1, L, chunk):
        b = min(t1, a + L)
        if b <= t0:
            continue
        r0 = max(a, t0)
        band = Pp[..., r0 - a:b - a, :] @ Ut.transpose(-1, -2)  # 0 from column a - s0 on: own lies over it
        lo, hi = a - s0, min(width, a - s0 + L)
        if hi > lo:
            band[..., lo:hi] = own[..., r0 - a:b - a, :hi - lo]
        yield r0, b, band


def pool_map(q, k, g, beta, pool, rows: slice, cols: slice, tile: int = TILE, chunk: int = 64, check=None) -> None:
    """Add one head's A[rows, cols] (q, k (N, d_k), g, beta (N,)) to a core.cell_pool.CellPool a band of BLOCK rows
    at a time: only the columns the band can reach (CellPool.visible; the rest are 0), `tile` columns at a time
    written into one buffer and pooled over their rows at once (CellPool.pool_rows), the band's row cells then
    pooled over their columns (add_rows). check() runs after each band."""
    s0, s1, t0, t1 = cols.start, cols.stop, rows.start, rows.stop
    width = s1 - s0
    if t0 < min(t1, s0):  # rows before the first column's token: zero
        pool.add(t0, min(t1, s0), q.new_zeros(min(t1, s0) - t0, 0, dtype=torch.float64))
    if t1 <= s0:
        return
    buf = q.new_empty(BLOCK * min(tile, width), dtype=torch.float64)
    parts = []  # the band's row cells × columns: max and min (or sums), one flat array each, grown as needed
    for a, Pp, own, Ut in _scan(q, k, g, beta, s0, width, t1, BLOCK, chunk):
        b = min(t1, a + BLOCK)
        if b <= t0:
            continue
        r0 = max(a, t0)
        P, visible = Pp[r0 - a:b - a], pool.visible(b)
        lo, hi = a - s0, min(width, a - s0 + BLOCK)
        i0, i1 = pool.row_cells(r0, b, q.device)[:2]
        need = (i1 - i0) * visible
        if not parts or parts[0].numel() < need:
            parts = [q.new_empty(need, dtype=torch.float64) for _ in range(2 if pool.reduce == "max" else 1)]
        band = [t[:need].view(i1 - i0, visible) for t in parts]
        for x in range(0, visible, tile):
            y = min(visible, x + tile)
            out = buf[:(b - r0) * (y - x)].view(b - r0, y - x)
            torch.matmul(P, Ut[x:y].T, out=out)  # 0 from column lo on: own lies over it
            ox, oy = max(x, lo), min(y, hi)
            if oy > ox:
                out[:, ox - x:oy - x] = own[r0 - a:b - a, ox - lo:oy - lo]
            pool.pool_rows(r0, b, out, [t[:, x:y] for t in band])
        pool.add_rows(r0, b, *band)
        if check is not None:
            check()
