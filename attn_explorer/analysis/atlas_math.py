"""The atlas's per-layer arithmetic: every head's metrics from one segment's kept q, k and lse (api.lazy), in
query-row chunks so that memory stays bounded (at most ~CHUNK_CELLS probabilities at once, whatever n), each
chunk passed over a few times while it is in cache (layer_values); the examples' keys from the few candidate
rows worked out again (row_probs, candidate_keys).

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

CHUNK_CELLS = 1 << 19  # probabilities held at once per layer (H × rows × keys): 2 MB of float32, cache-sized
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


def _plain(o) -> bool:
    """Whether a layer's logits are scale·q·k under the causal triangle alone (no window, chunks, mask or cap),
    in float32: a bfloat16 layer whose logits were rounded (core.bf16_attention, o.rounded) takes the general
    path, which rounds them as the forward did (core.lazy.layer_logits), so its lse fits."""
    return (o.causal and o.window is None and o.chunk is None and o.mask is None and o.softcap is None
            and not getattr(o, "rounded", False))


def widened_keys(lz) -> torch.Tensor | None:
    """On the fast path (_plain), the layer's keys widened by a column of ones, grouped (H_kv, M, d + 1): one
    product with q widened by -lse gives log p. None for the general path."""
    q, k, o = lz.q, lz.k, lz.options
    if _plain(o) and q.shape[1] % k.shape[1] == 0:
        return torch.cat([k[0].float(), torch.ones(k.shape[1], k.shape[-2], 1)], dim=-1)
    return None


def _probs(q, k, ka, lse, o, rows: slice, cols: slice, n: int, m: int):
    """(p, logp) of rows × cols for every head, float32 (H, r, c). p is exactly 0 where a key cannot be seen; logp
    is finite wherever p > 0 (so Σ p·logp needs no mask). ka: widened_keys, or None for the general path."""
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
    self_r: torch.Tensor  # chunk rows whose own token is among the chunk's keys, and its column
    self_c: torch.Tensor
    flat: dict  # "duplicate" / "induction" -> (chunk rows (P,), flat row·c + col indices (P,))


def _rows_at(lo: int, n: int, m: int, H: int, causal: bool) -> int:
    """How many rows from lo make a chunk of about CHUNK_CELLS probabilities: a causal row sees keys up to itself,
    so early rows (short) come more at a time."""
    if not causal:
        return max(1, CHUNK_CELLS // max(1, H * m))
    b = lo + (m - n) + 1  # keys seen by row lo
    r = int((-b + (b * b + 4 * CHUNK_CELLS / max(1, H)) ** 0.5) / 2)  # H·r·(b + r) <= CHUNK_CELLS
    return max(1, r)


def chunk_plan(pairs: Pairs, n: int, m: int, H: int, causal: bool, o) -> list[Chunk]:
    """The row chunks of a layer with options o (window, chunks) over n queries and m keys."""
    cols_all = torch.arange(m, dtype=torch.float32)
    out = []
    lo = 0
    while lo < n:
        hi = min(n, lo + _rows_at(lo, n, m, H, causal))
        c_lo, c_hi = core_lazy.key_range(lo, hi, n, m, causal, o.window, o.chunk)  # keys these rows may see
        cols = slice(c_lo, max(c_lo + 1, c_hi))
        c = cols.stop - cols.start
        sk = pairs.sink_cols[(pairs.sink_cols >= c_lo) & (pairs.sink_cols < cols.stop)] - c_lo
        i = torch.arange(lo, hi)
        j = i + (m - n) - 1 - c_lo
        ok = (i >= 1) & (j >= 0) & (j < c)
        own = i + (m - n) - c_lo
        mine = (own >= 0) & (own < c)
        flat = {}
        for kind, pr, pc in (("duplicate", pairs.dup_rows, pairs.dup_cols),
                             ("induction", pairs.ind_rows, pairs.ind_cols)):
            a, b = int(torch.searchsorted(pr, lo)), int(torch.searchsorted(pr, hi))  # pairs sorted by row
            rr, cc = pr[a:b], pc[a:b]
            keep = (cc >= c_lo) & (cc < cols.stop)
            rr, cc = rr[keep] - lo, cc[keep] - c_lo
            flat[kind] = (rr, rr * c + cc)
        out.append(Chunk(slice(lo, hi), cols, sk, torch.arange(lo, hi, dtype=torch.float32) + (m - n),
                         cols_all[cols], (i - lo)[ok], j[ok], (i - lo)[mine], own[mine], flat))
        lo = hi
    return out


KINDS = ("weight",) + ROW_KINDS  # layer_values' rows, in this order
_K = {kind: i for i, kind in enumerate(KINDS)}


def sinkless(z: torch.Tensor | None, pairs: Pairs) -> torch.Tensor | None:
    """The keys' copy z-scores (H, m) with the sinks' set to 0 (sinks carry no copy)."""
    if z is None:
        return None
    zs = z.clone()
    zs[:, pairs.sink_cols] = 0.0
    return zs


def layer_values(lz, pairs: Pairs, zs: torch.Tensor | None, causal: bool, plans: dict | None = None,
                 ka: torch.Tensor | None = None) -> torch.Tensor:
    """Every row's value by each of KINDS for every head of one lazily kept layer (api.lazy.LazyLayer): (len(KINDS),
    H, n) float32, worked out in row chunks of about CHUNK_CELLS probabilities (each chunk passed over a few times
    while it is in cache). weight: the row's largest weight on a key that is neither itself nor a sink (0 if
    none); copy: Σ_j p_ij zs_j (0 when zs is None). plans: a dict kept for one segment, so that layers with the same
    masking share their chunks' index work. ka: widened_keys(lz), when already at hand."""
    q, k, lse, o = lz.q, lz.k, lz.lse, lz.options
    H, n, m = q.shape[1], q.shape[-2], k.shape[-2]
    if ka is None:
        ka = widened_keys(lz)
    plans = {} if plans is None else plans
    key = (H, n, m, causal, o.window, o.chunk, CHUNK_CELLS)
    if key not in plans:
        plans[key] = chunk_plan(pairs, n, m, H, causal, o)
    out = torch.zeros(len(KINDS), H, n)
    for ch in plans[key]:
        rows, cols = ch.rows, ch.cols
        p, logp = _probs(q, k, ka, lse, o, rows, cols, n, m)
        out[_K["entropy"], :, rows] = logp.mul_(p).sum(-1).div_(-LN2)
        sk = ch.sinks
        if len(sk) == 1:
            out[_K["sink"], :, rows] = p[..., int(sk[0])]
        elif len(sk):
            out[_K["sink"], :, rows] = p[..., sk].sum(-1)
        if causal:
            out[_K["distance"], :, rows] = ch.qpos[None] * p.sum(-1) - p @ ch.kpos
        else:
            out[_K["distance"], :, rows] = (p * (ch.qpos[:, None] - ch.kpos[None]).abs()).sum(-1)
        if len(ch.prev_r):
            out[_K["prev_token"], :, rows.start + ch.prev_r] = p[:, ch.prev_r, ch.prev_c]
        flat_p = p.reshape(H, -1)  # a view: p is contiguous
        for kind, (rr, fi) in ch.flat.items():
            if len(rr):
                out[_K[kind], :, rows].index_add_(1, rr, flat_p[:, fi])
        if zs is not None:
            zc = zs[:, cols]
            for h in range(H):  # H matrix-vector products: faster than one batched product
                out[_K["copy"], h, rows] = p[h] @ zc[h]
        p[:, ch.self_r, ch.self_c] = 0.0  # last: a token on itself does not count for the weight, nor do sinks
        p[..., sk] = 0.0
        out[_K["weight"], :, rows] = p.amax(-1)
    return out


def row_probs(lz, hs: torch.Tensor, rs: torch.Tensor, ka: torch.Tensor | None) -> torch.Tensor:
    """(K, m) the probabilities of (head hs, query row rs) pairs over all keys: a few rows worked out again."""
    q, k, lse, o = lz.q, lz.k, lz.lse, lz.options
    H, n, m = q.shape[1], q.shape[-2], k.shape[-2]
    out = torch.empty(len(hs), m)
    if ka is None:  # the general path: row by row, every head
        for i in torch.unique(rs).tolist():
            at = torch.nonzero(rs == i)[:, 0]
            out[at] = _probs(q, k, None, lse, o, slice(i, i + 1), slice(0, m), n, m)[0][hs[at], 0]
        return out
    G = ka.shape[0]
    for g in range(G):  # by kv head: each pair's q widened by -lse, against its keys
        at = torch.nonzero(hs // (H // G) == g)[:, 0]
        if len(at) == 0:
            continue
        h, r = hs[at], rs[at]
        qa = torch.cat([q[0, h, r].float() * o.scale, -lse[0, h, r].float()[:, None]], dim=-1)  # (k, d + 1)
        p = torch.exp(qa @ ka[g].T)
        out[at] = p.masked_fill_(torch.arange(m)[None, :] > (r + (m - n))[:, None], 0.0)  # keys after the query
    return out


def candidate_keys(kind: str, p: torch.Tensor, i: torch.Tensor, hs: torch.Tensor, pairs: Pairs,
                   zs: torch.Tensor | None) -> torch.Tensor:
    """For candidate rows (K, m) (their probabilities over all keys; query rows i, heads hs), the key each example
    points at for a kind: where that row's value comes from (segment indices). p may be changed."""
    m = p.shape[-1]
    at = i + (m - pairs.n)  # the query's own position among the keys
    if kind == "prev_token":
        return (at - 1).clamp_min(0)
    sk = pairs.sink_cols[pairs.sink_cols < m]
    if kind == "sink":
        return sk[p[:, sk].argmax(-1)] if len(sk) else p.argmax(-1)
    if kind in ("duplicate", "induction"):
        pr, pc = (pairs.dup_rows, pairs.dup_cols) if kind == "duplicate" else (pairs.ind_rows, pairs.ind_cols)
        uniq, where = torch.unique(i, return_inverse=True)
        pos = torch.searchsorted(uniq, pr).clamp_max(len(uniq) - 1)
        hit = uniq[pos] == pr
        allowed = torch.zeros(len(uniq), m, dtype=torch.bool)
        allowed[pos[hit], pc[hit]] = True
        return torch.where(allowed[where], p, -1.0).argmax(-1)
    if kind == "copy" and zs is not None:
        return (p * zs[hs]).argmax(-1)
    if kind == "distance":
        return (p * (torch.arange(m)[None, :] - at[:, None]).abs().float()).argmax(-1)
    if kind == "weight":
        ok = (at >= 0) & (at < m)
        p[torch.nonzero(ok)[:, 0], at[ok]] = 0.0
        p[:, sk] = 0.0
    return p.argmax(-1)
