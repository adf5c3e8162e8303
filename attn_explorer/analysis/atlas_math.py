"""The atlas's per-layer arithmetic: every head's metrics from one segment's kept q, k and lse (api.lazy), in
query-row chunks so that memory stays bounded (at most ~CHUNK_CELLS probabilities at once, whatever n).

Per row i of a segment (the atlas sums these and divides by the rows counted):

- entropy  −Σ_j p_ij log2 p_ij;                 sink  Σ over the first token and special keys of p_ij;
- distance Σ_j p_ij |i − j|;                     prev_token  p_i,i−1 (rows i ≥ 1);
- duplicate  Σ p_ij over earlier j with the query's own token id (rows that have one, the query not special);
- induction  Σ p_ij over 1 ≤ j < i whose previous token j − 1 has the query's token id (rows that have one);
- copy  a head's direct OV effect on the attended token's logit, as a z-score among the whole vocabulary:
  o_j = v_j·W_O[h] (through Gemma's post-attention norm gain), read through the final norm's gain (and
  centring, for LayerNorm) and W_U; z_j = (u_t·o_j − ū·o_j) / sqrt(o_jᵀ Σ_U o_j) for the key's own token t
  (ū, Σ_U: the mean and covariance of W_U's rows). The norms' per-position scales are positive factors and
  leave z unchanged. A head's copy score is the attention-weighted mean of z_j over keys that are not sinks.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from attn_explorer.core import lazy as core_lazy
from attn_explorer.errors import UserError

CHUNK_CELLS = 1 << 20  # probabilities held at once per layer (H × rows × keys): 4 MB of float32, cache-sized
ROW_KINDS = ("entropy", "sink", "distance", "prev_token", "duplicate", "induction", "copy")
LN2 = float(np.log(2.0))
_STATS: dict = {}  # id(unembedding) -> (a weak reference to it, ..., CopyReader's statistics)
FLOOR = 1e-3  # the copy score's least logit variance, as a share of a typical direction's (CopyReader.z)


@dataclass
class Pairs:
    """A segment's token structure, shared by every layer: flat (row, key) pairs of earlier copies."""

    n: int
    sink_cols: torch.Tensor  # long (S,): the first token and special tokens
    real_query: torch.Tensor  # bool (n,): not special
    dup_rows: torch.Tensor  # long (P,), dup_cols (P,): j < i, id_j == id_i, query and key not special
    dup_cols: torch.Tensor
    ind_rows: torch.Tensor  # long (Q,), ind_cols (Q,): 1 <= j < i, id_{j-1} == id_i, query not special
    ind_cols: torch.Tensor


def segment_pairs(ids: np.ndarray, special: np.ndarray) -> Pairs:
    ids = np.asarray(ids, dtype=np.int64)
    special = np.asarray(special, dtype=bool)
    n = len(ids)
    real = ~special
    same = (ids[:, None] == ids[None, :]) & np.tri(n, k=-1, dtype=bool) & real[:, None] & real[None, :]
    dr, dc = np.nonzero(same)
    prev = np.full(n, -1, dtype=np.int64)
    prev[1:] = ids[:-1]
    after = (ids[:, None] == prev[None, :]) & np.tri(n, k=-1, dtype=bool) & real[:, None]
    after[:, 0] = False
    ir, ic = np.nonzero(after)
    sinks = np.unique(np.concatenate([[0], np.nonzero(special)[0]]))
    t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=torch.long).contiguous()  # noqa: E731
    return Pairs(n, t(sinks), torch.as_tensor(real), t(dr), t(dc), t(ir), t(ic))


class CopyReader:
    """What the copy score needs, worked out once per model: the unembedding's row statistics after the final
    norm's gain, and per layer the heads' W_O as the score reads them. `reason` says why there is none."""

    def __init__(self, model):
        self.reason, self.layers = "", {}
        try:
            from attn_explorer.analysis.residual import decoder_parts

            parts = decoder_parts(model.module)
            if parts.project_out is not None:
                raise UserError("its LM head reads a projection of the stream (OPT's project_out)")
            gain, centre = _gain(parts.final_norm)
        except UserError as e:
            self.reason = f"{model.info.name} has no copy score: {e}"
            return
        self.U, self.gain, self.centre, self._key = parts.unembed.detach(), gain, centre, parts.unembed
        self.blocks, self.model = parts.blocks, model
        self._stats()

    @property
    def ok(self) -> bool:
        return not self.reason

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W_U's rows of `ids` as the score reads them: (n, D) float32."""
        u = self.U[ids].float()
        if self.gain is not None:
            u = u * self.gain
        return u - u.mean(-1, keepdim=True) if self.centre else u

    def distinct(self, ids: torch.Tensor):
        """(rows of the distinct ids, each id's index among them): what z takes as u, once per segment."""
        uniq, where = torch.unique(ids, return_inverse=True)
        return self.rows(uniq), where

    def _stats(self) -> None:
        """ū and Σ_U: one pass over the vocabulary (V·D² work, ~16 GFLOP on SmolLM2), kept per unembedding
        tensor while it and the final norm's gain are unchanged, so a second atlas of the same model skips it."""
        kept = _STATS.get(id(self._key))
        gain = None if self.gain is None else self.gain.clone()
        if kept is not None and kept[5]() is self._key and kept[0] == self.U._version and kept[1] == self.centre and (
                (kept[2] is None and gain is None) or (kept[2] is not None and gain is not None
                                                       and torch.equal(kept[2], gain))):
            self.mean, self.cov = kept[3], kept[4]
            return
        self._compute_stats()
        for k in [k for k, v in _STATS.items() if v[5]() is None]:  # models since freed
            del _STATS[k]
        _STATS[id(self._key)] = (self.U._version, self.centre, gain, self.mean, self.cov, weakref.ref(self._key))

    def _compute_stats(self) -> None:
        V, D = self.U.shape
        total = torch.zeros(D, dtype=torch.float64)
        gram = torch.zeros(D, D, dtype=torch.float64)
        for lo in range(0, V, 2048):  # chunks of the vocabulary: never a second (V, D) matrix
            u = self.rows(torch.arange(lo, min(V, lo + 2048)))
            total += u.sum(0).double()
            gram += (u.T @ u).double()
        mean = total / V
        self.mean, self.cov = mean.float(), (gram / V - torch.outer(mean, mean)).float()

    def layer(self, l: int):
        """(W (H, d, D) with the post-attention norm's gain, M (H, d, d) = W Σ Wᵀ, m (H, d) = W ū)."""
        if l not in self.layers:
            block = self.blocks[l]
            W = self.model.W_O(l).float()  # (H, d, D)
            post = getattr(block, "post_attn_norm", None)
            if post is not None and not isinstance(post, torch.nn.Identity):
                g, c = _gain(post)
                if g is not None:
                    W = W * g
                if c:
                    W = W - W.mean(-1, keepdim=True)
            M = torch.einsum("hde,ef,hgf->hdg", W, self.cov, W)
            floor = torch.einsum("hde,hge->hdg", W, W) * (FLOOR * float(torch.diagonal(self.cov).mean()))
            H, d, D = W.shape
            both = torch.cat([M, floor], dim=-1)  # (H, d, 2d): one product gives both quadratic forms
            self.layers[l] = (W.reshape(H * d, D).T.contiguous(), both, W @ self.mean)  # D·H·d numbers a layer
        return self.layers[l]

    def z(self, l: int, v: torch.Tensor, ids: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """(H, n) z-scores of each key's own token's logit in each head's direct output. v: (H, n, d); u: the
        keys' distinct(ids), when already at hand (one segment, every layer)."""
        Wt, both, m = self.layer(l)
        H, n, d = v.shape
        if u is None:
            u = self.distinct(ids)
        rows, where = u  # the distinct tokens' W_U rows, and where each key's token is among them
        g = (rows @ Wt)[where].view(n, H, d).transpose(0, 1)  # (H, n, d): head h's W_O applied to the key's W_U row
        num = torch.linalg.vecdot(g, v) - torch.bmm(v, m[..., None])[..., 0]
        vm = torch.bmm(v, both)  # (H, n, 2d)
        var, least = torch.linalg.vecdot(vm[..., :d], v), torch.linalg.vecdot(vm[..., d:], v)
        # an output in a direction W_U barely reads (its logit spread under FLOOR of a typical direction's) is
        # not a copy: its z is measured against that floor, not against its own vanishing spread
        return num / torch.maximum(var, least).clamp_min(1e-30).sqrt()


def _gain(norm):
    from attn_explorer.core.layers import RMSNorm

    if isinstance(norm, torch.nn.Identity):
        return None, False
    if isinstance(norm, torch.nn.LayerNorm):
        return (None if norm.weight is None else norm.weight.detach().float()), True
    if isinstance(norm, RMSNorm):
        w = norm.weight.detach().float()
        return ((1.0 + w) if norm.unit_offset else w), False
    raise UserError(f"its final norm is a {type(norm).__name__}, not LayerNorm or RMSNorm")


@dataclass
class RowScores:
    """One row chunk of one layer: per kind (H, r) row values, and what finding a key needs."""

    rows: slice
    values: dict  # kind -> (H, r) float32
    p: torch.Tensor  # (H, r, c) probabilities
    z: torch.Tensor | None  # (H, c) copy z-scores of the keys


def _plain(o) -> bool:
    """Whether a layer's logits are scale·q·k under the causal triangle alone (no window, chunks, mask or cap)."""
    return o.causal and o.window is None and o.chunk is None and o.mask is None and o.softcap is None


def _probs(q, k, ka, lse, o, rows: slice, cols: slice, n: int, m: int):
    """(p, logp) of rows × cols for every head, float32 (H, r, c). p is exactly 0 where a key cannot be seen; logp
    is finite wherever p > 0 (so Σ p·logp needs no mask). ka: on the fast path (_plain), the layer's keys widened
    by a column of ones, grouped (H_kv, M, d + 1); None for the general path."""
    ls = lse[0, :, rows].float()
    if ka is not None:  # one product gives logit - lse: q widened by -lse (as core.lazy._Head), grouped by kv head
        H, r, G = q.shape[1], rows.stop - rows.start, ka.shape[0]
        qa = torch.cat([q[0, :, rows].float() * o.scale, -ls[..., None]], dim=-1)  # (H, r, d + 1)
        logp = torch.matmul(qa.view(G, (H // G) * r, -1), ka[:, cols].transpose(1, 2)).view(H, r, -1)
        p = torch.exp(logp).tril_(rows.start + (m - n) - cols.start)  # keys after the query: exactly 0
        return p, logp
    s = core_lazy.layer_logits(q, core_lazy._rep(k, q.shape[1]), o, rows, cols, n, m)[0]
    live = torch.isfinite(ls)
    logp = s - torch.where(live, ls, 0.0)[..., None]
    p = torch.where(live[..., None], torch.exp(logp), 0.0)
    return p, torch.where(p > 0, logp, 0.0)


@dataclass
class Chunk:
    """One row chunk's index work, the same for every layer with the same masking (worked out once a segment)."""

    rows: slice
    cols: slice
    sinks: torch.Tensor  # sink keys, as chunk columns
    qpos: torch.Tensor  # float (r,) query positions; kpos (c,) key positions
    kpos: torch.Tensor
    prev_r: torch.Tensor  # chunk rows that have a previous token among the chunk's keys, and that key's column
    prev_c: torch.Tensor
    flat: dict  # "duplicate" / "induction" -> (chunk rows (P,), flat row·c + col indices (P,))


def chunk_plan(pairs: Pairs, n: int, m: int, H: int, causal: bool, o) -> list[Chunk]:
    """The row chunks of a layer with options o (window, chunks) over n queries and m keys."""
    step = max(1, min(n, CHUNK_CELLS // max(1, H * m)))
    cols_all = torch.arange(m, dtype=torch.float32)
    out = []
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        c_lo, c_hi = core_lazy.key_range(lo, hi, n, m, causal, o.window, o.chunk)  # keys these rows may see
        cols = slice(c_lo, max(c_lo + 1, c_hi))
        c = cols.stop - cols.start
        sk = pairs.sink_cols[(pairs.sink_cols >= c_lo) & (pairs.sink_cols < cols.stop)] - c_lo
        i = torch.arange(max(lo, 1), hi)
        j = i + (m - n) - 1 - c_lo
        ok = (j >= 0) & (j < c)
        flat = {}
        for kind, pr, pc in (("duplicate", pairs.dup_rows, pairs.dup_cols),
                             ("induction", pairs.ind_rows, pairs.ind_cols)):
            a, b = int(torch.searchsorted(pr, lo)), int(torch.searchsorted(pr, hi))  # pairs sorted by row
            rr, cc = pr[a:b], pc[a:b]
            keep = (cc >= c_lo) & (cc < cols.stop)
            rr, cc = rr[keep] - lo, cc[keep] - c_lo
            flat[kind] = (rr, rr * c + cc)
        out.append(Chunk(slice(lo, hi), cols, sk, torch.arange(lo, hi, dtype=torch.float32) + (m - n),
                         cols_all[cols], (i - lo)[ok], j[ok], flat))
    return out


def layer_chunks(lz, pairs: Pairs, z: torch.Tensor | None, causal: bool, plans: dict | None = None):
    """Yield (RowScores, cols) for consecutive row chunks of one lazily kept layer (api.lazy.LazyLayer). plans:
    a dict kept for one segment, so that layers with the same masking share their chunks' index work."""
    q, k, lse, o = lz.q, lz.k, lz.lse, lz.options
    H, n, m = q.shape[1], q.shape[-2], k.shape[-2]
    ka = None
    if _plain(o) and H % k.shape[1] == 0:
        ka = torch.cat([k[0].float(), torch.ones(k.shape[1], m, 1)], dim=-1)  # (H_kv, M, d + 1)
    plans = {} if plans is None else plans
    key = (H, n, m, causal, o.window, o.chunk)
    if key not in plans:
        plans[key] = chunk_plan(pairs, n, m, H, causal, o)
    zs = None
    if z is not None:
        zs = z.clone()
        zs[:, pairs.sink_cols] = 0.0  # sinks carry no copy
    for ch in plans[key]:
        rows, cols = ch.rows, ch.cols
        r = rows.stop - rows.start
        p, logp = _probs(q, k, ka, lse, o, rows, cols, n, m)
        values = {"entropy": torch.linalg.vecdot(p, logp) / -LN2}
        sk = ch.sinks
        values["sink"] = p[..., sk].sum(-1) if len(sk) > 1 else (p[..., int(sk[0])] if len(sk) else torch.zeros(H, r))
        if causal:
            values["distance"] = ch.qpos[None] * p.sum(-1) - p @ ch.kpos
        else:
            values["distance"] = (p * (ch.qpos[:, None] - ch.kpos[None]).abs()).sum(-1)
        prev = torch.zeros(H, r)
        if len(ch.prev_r):
            prev[:, ch.prev_r] = p[:, ch.prev_r, ch.prev_c]
        values["prev_token"] = prev
        flat_p = p.reshape(H, -1)  # a view when p is contiguous (the fast path)
        for kind, (rr, fi) in ch.flat.items():
            acc = torch.zeros(H, r)
            if len(rr):
                acc.index_add_(1, rr, flat_p[:, fi])
            values[kind] = acc
        zc = None
        if zs is not None:
            zc = zs[:, cols]
            values["copy"] = torch.stack([p[h] @ zc[h] for h in range(H)])  # H matrix-vector products: fast
        yield RowScores(rows, values, p, zc), cols


def row_keys(kind: str, sc: RowScores, cols: slice, hs: torch.Tensor, rs: torch.Tensor, pairs: Pairs) -> torch.Tensor:
    """For candidate rows (heads hs, chunk rows rs), the key each example points at for a kind: where that row's
    metric comes from (segment indices). Vectorised over the candidates."""
    i = rs + sc.rows.start
    if kind == "prev_token":
        return (i - 1).clamp_min(0)
    rows = sc.p[hs, rs]  # (K, c)
    if kind == "sink":
        sk = pairs.sink_cols[(pairs.sink_cols >= cols.start) & (pairs.sink_cols < cols.stop)]
        if len(sk) == 0:
            return rows.argmax(-1) + cols.start
        return sk[rows[:, sk - cols.start].argmax(-1)]
    if kind in ("duplicate", "induction"):
        pr, pc = (pairs.dup_rows, pairs.dup_cols) if kind == "duplicate" else (pairs.ind_rows, pairs.ind_cols)
        sel = (pr >= sc.rows.start) & (pr < sc.rows.stop) & (pc >= cols.start) & (pc < cols.stop)
        allowed = torch.zeros(sc.rows.stop - sc.rows.start, cols.stop - cols.start, dtype=torch.bool)
        allowed[pr[sel] - sc.rows.start, pc[sel] - cols.start] = True
        return torch.where(allowed[rs], rows, -1.0).argmax(-1) + cols.start
    if kind == "copy" and sc.z is not None:
        return (rows * sc.z[hs]).argmax(-1) + cols.start
    if kind == "distance":
        d = (torch.arange(cols.start, cols.stop)[None, :] - i[:, None]).abs().float()
        return (rows * d).argmax(-1) + cols.start
    return rows.argmax(-1) + cols.start


def top_weights(p: torch.Tensor, rows: slice, cols: slice, sink_cols: torch.Tensor, floor: torch.Tensor):
    """The chunk's rows whose largest weight to another token that is not a sink is above the head's floor (H,)
    and above 0, each with that best pair: tensors (head, query, key, weight, weight) in segment indices, or None
    (the caller keeps each head's best). p is left as it was."""
    H, r, c = p.shape
    i = torch.arange(rows.start, rows.stop)
    j = i - cols.start
    ok = (j >= 0) & (j < c)
    di, dj = torch.nonzero(ok)[:, 0], j[ok]
    sc = sink_cols[(sink_cols >= cols.start) & (sink_cols < cols.stop)] - cols.start
    kept_d, kept_s = p[:, di, dj].clone(), p[..., sc].clone()
    p[:, di, dj] = 0.0  # a token on itself does not count, nor do sinks
    p[..., sc] = 0.0
    try:
        best, keys = p.max(-1)  # (H, r): each row's largest weight and its key
        hs, rs = torch.nonzero((best > floor[:, None]) & (best > 0), as_tuple=True)
        if len(hs) == 0:
            return None
        vals = best[hs, rs]
        return hs, rs + rows.start, keys[hs, rs] + cols.start, vals, vals
    finally:
        p[:, di, dj] = kept_d
        p[..., sc] = kept_s
