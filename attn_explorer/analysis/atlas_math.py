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

from dataclasses import dataclass

import numpy as np
import torch

from attn_explorer.core import lazy as core_lazy
from attn_explorer.errors import UserError

CHUNK_CELLS = 1 << 22  # probabilities held at once per layer (H × rows × keys): 16 MB of float32
ROW_KINDS = ("entropy", "sink", "distance", "prev_token", "duplicate", "induction", "copy")
LN2 = float(np.log(2.0))
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
    t = lambda a: torch.as_tensor(a, dtype=torch.long)  # noqa: E731
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
        self.U, self.gain, self.centre = parts.unembed.detach(), gain, centre
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

    def _stats(self) -> None:
        V, D = self.U.shape
        total = torch.zeros(D, dtype=torch.float64)
        gram = torch.zeros(D, D, dtype=torch.float64)
        for lo in range(0, V, 8192):  # chunks of the vocabulary: never a second (V, D) matrix
            u = self.rows(torch.arange(lo, min(V, lo + 8192))).double()
            total += u.sum(0)
            gram += u.T @ u
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
            self.layers = {l: (W, M, W @ self.mean, floor)}  # one layer kept at a time
        return self.layers[l]

    def z(self, l: int, v: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(H, n) z-scores of each key's own token's logit in each head's direct output. v: (H, n, d)."""
        W, M, m, floor = self.layer(l)
        u = self.rows(ids)  # (n, D)
        num = torch.einsum("nd,hkd,hnk->hn", u, W, v) - torch.einsum("hk,hnk->hn", m, v)
        var = torch.einsum("hnk,hkg,hng->hn", v, M, v)
        # an output in a direction W_U barely reads (its logit spread under FLOOR of a typical direction's) is
        # not a copy: its z is measured against that floor, not against its own vanishing spread
        least = torch.einsum("hnk,hkg,hng->hn", v, floor, v)
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


def layer_chunks(lz, pairs: Pairs, z: torch.Tensor | None, causal: bool):
    """Yield RowScores for consecutive row chunks of one lazily kept layer (api.lazy.LazyLayer)."""
    q, k, lse, o = lz.q, lz.k, lz.lse, lz.options
    H, n, m = q.shape[1], q.shape[-2], k.shape[-2]
    k = core_lazy._rep(k, H)
    step = max(1, min(n, CHUNK_CELLS // max(1, H * m)))
    cols_all = torch.arange(m, dtype=torch.float32)
    sink_mask = torch.zeros(m, dtype=torch.bool)
    sink_mask[pairs.sink_cols] = True
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        rows = slice(lo, hi)
        c_lo, c_hi = core_lazy.key_range(lo, hi, n, m, causal, o.window, o.chunk)  # keys these rows may see
        cols = slice(c_lo, max(c_lo + 1, c_hi))
        s = core_lazy.layer_logits(q, k, o, rows, cols, n, m)[0]  # (H, r, c)
        ls = lse[0, :, rows].float()
        live = torch.isfinite(ls)
        logp = s - torch.where(live, ls, 0.0)[..., None]
        p = torch.exp(logp)
        p = torch.where(live[..., None], p, 0.0)
        values = {}
        plogp = torch.where(p > 0, p * logp, 0.0)
        values["entropy"] = -plogp.sum(-1) / LN2
        values["sink"] = p[..., sink_mask[cols]].sum(-1)
        r = hi - lo
        qpos = torch.arange(lo, hi, dtype=torch.float32) + (m - n)
        kpos = cols_all[cols]
        if causal:
            values["distance"] = qpos[None] * p.sum(-1) - p @ kpos
        else:
            values["distance"] = (p * (qpos[:, None] - kpos[None]).abs()).sum(-1)
        prev = torch.zeros(H, r)
        i = torch.arange(max(lo, 1), hi)
        j = i + (m - n) - 1 - c_lo
        ok = (j >= 0) & (j < cols.stop - cols.start)
        if ok.any():
            prev[:, (i - lo)[ok]] = p[:, (i - lo)[ok], j[ok]]
        values["prev_token"] = prev
        for kind, pr, pc in (("duplicate", pairs.dup_rows, pairs.dup_cols), ("induction", pairs.ind_rows, pairs.ind_cols)):
            sel = (pr >= lo) & (pr < hi) & (pc >= c_lo) & (pc < cols.stop)
            acc = torch.zeros(H, r)
            if sel.any():
                rr, cc = pr[sel] - lo, pc[sel] - c_lo
                got = p.reshape(H, -1)[:, rr * p.shape[-1] + cc]
                acc.index_add_(1, rr, got)
            values[kind] = acc
        zc = None
        if z is not None:
            zc = torch.where(sink_mask[cols], 0.0, z[:, cols])  # sinks carry no copy
            values["copy"] = torch.bmm(p, zc[..., None])[..., 0]
        yield RowScores(rows, values, p, zc), cols


def row_key(kind: str, sc: RowScores, cols: slice, h: int, i_local: int, pairs: Pairs, sink_cols: torch.Tensor) -> int:
    """The key a row's example points at for a kind (an index into the segment)."""
    row = sc.p[h, i_local]
    i = sc.rows.start + i_local
    if kind == "prev_token":
        return max(0, i - 1)
    if kind == "sink":
        idx = sink_cols[(sink_cols >= cols.start) & (sink_cols < cols.stop)]
        return int(idx[row[idx - cols.start].argmax()]) if len(idx) else cols.start
    if kind in ("duplicate", "induction"):
        pr, pc = (pairs.dup_rows, pairs.dup_cols) if kind == "duplicate" else (pairs.ind_rows, pairs.ind_cols)
        js = pc[(pr == i) & (pc >= cols.start) & (pc < cols.stop)]
        return int(js[row[js - cols.start].argmax()]) if len(js) else int(row.argmax()) + cols.start
    if kind == "copy" and sc.z is not None:
        return int((row * sc.z[h]).argmax()) + cols.start
    if kind == "distance":
        d = (torch.arange(cols.start, cols.stop) - i).abs().float()
        return int((row * d).argmax()) + cols.start
    return int(row.argmax()) + cols.start


def top_weights(p: torch.Tensor, rows: slice, cols: slice, sink_cols: torch.Tensor, k: int):
    """Per head the k largest weights of the chunk from a row to another token that is not a sink:
    (values (H, k'), rows (H, k'), keys (H, k')) in segment indices."""
    H, r, c = p.shape
    a = p.clone()
    i = torch.arange(rows.start, rows.stop)
    j = i - cols.start
    ok = (j >= 0) & (j < c)
    a[:, torch.nonzero(ok)[:, 0], j[ok]] = 0.0  # a token on itself does not count
    sc = sink_cols[(sink_cols >= cols.start) & (sink_cols < cols.stop)] - cols.start
    if len(sc):
        a[..., sc] = 0.0
    vals, flat = a.reshape(H, -1).topk(min(k, r * c), dim=-1)
    return vals, flat // c + rows.start, flat % c + cols.start
