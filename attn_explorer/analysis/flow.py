"""The contribution graph: information flow routes (Ferrando & Voita 2024) with ALTI-style proportions.

In a pre-LN decoder, block l turns token i's residual stream x_i into

    y_i = x_i + Σ_j z_ij + b          z_ij = Σ_h α^h_ij f_h(x_j),  f_h(x_j) = W_O^h v^h_j   (the attention step)
    out_i = y_i + m_i                                                                        (the MLP step)

Each part's share of the sum is its ALTI proximity (Ferrando et al. 2022), normalised over the parts:

    p(z, y) = max(0, ‖y‖₁ − ‖y − z‖₁) / Σ_parts max(0, ‖y‖₁ − ‖y − part‖₁)

so a part that points where the sum points, and is large, gets a large share; one that cancels gets
none. The graph has a node per (level, token) (level 0: the embeddings; level l + 1: after block l); its
edges are token j → token i through block l's attention (weight: z_ij's share of y_i) and i → i through the
residual stream (x_i's share). `trace` follows them down from one output token and keeps each edge whose
share reaches a threshold, as Ferrando & Voita's Algorithm 1 does (the threshold is local: a share of each
node's own sum). The MLP's share of out_i is kept per node (it is not a route between tokens).

Gemma's norm after the attention branch is frozen at the branch's whole output (see analysis.lens), so
z_ij is its part of the branch after that norm. Which head carries an edge is read from ‖α^h_ij f_h(x_j)‖₁
per head (after that norm), kept for every edge.

Cost: one forward pass that keeps the probabilities, plus O(L · N² · D) for the shares, in blocks of
queries so memory stays bounded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from attn_explorer.analysis.residual import FrozenNorm, residual_run
from attn_explorer.errors import UserError

if TYPE_CHECKING:  # the model is api's (import-linter sees this arrow); torch is imported in the functions
    from attn_explorer.api.model import Model

BLOCK_FLOATS = 1 << 23  # queries per block: at most ~32 MB of (queries, N, D) float32 at a time


@dataclass
class FlowGraph:
    """Every edge's share for one input (NumPy): trace it with `trace(graph, position, threshold)`."""

    tokens: list[str]
    attn: np.ndarray  # float32 (L, N, N): [l, i, j] = share of z_ij (token j through block l's attention) in y_i
    resid: np.ndarray  # float32 (L, N): share of x_i (the residual stream) in y_i
    mlp: np.ndarray  # float32 (L, N): share of the MLP's m_i in block l's output for token i
    heads: np.ndarray  # float16 (L, H, N, N): ‖α^h_ij f_h(x_j)‖₁ per head (which heads carry an edge)
    model: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return self.attn.shape[0]

    def head_shares(self, layer: int, src: int, dst: int) -> np.ndarray:
        """(H,) each head's part of edge src → dst in `layer`, by ‖α f(x)‖₁, summing to 1 (zeros if none)."""
        v = self.heads[layer, :, dst, src].astype(np.float64)
        s = v.sum()
        return v / s if s > 0 else v


@dataclass(frozen=True)
class Edge:
    """One kept edge: token src at level `layer` → token dst at level layer + 1."""

    layer: int  # the block it passes through
    src: int
    dst: int
    kind: str  # "attn" (through the block's attention) or "resid" (the residual stream, src == dst)
    weight: float  # its share of dst's sum
    head: int = -1  # attn: the head carrying most of it (by ‖α f(x)‖₁)


def proximity(y, parts):
    """ALTI's max(0, ‖y‖₁ − ‖y − part‖₁) for each part: y (..., D), parts (..., K, D) -> (..., K)."""
    import torch

    return torch.clamp(y.abs().sum(-1, keepdim=True) - (y[..., None, :] - parts).abs().sum(-1), min=0.0)


def _layer_shares(block, cap, b: int = 0):
    """(attn (N, N), resid (N,), mlp (N,), heads (H, N, N)) of one block (torch, float32)."""
    import torch
    from torch import nn

    x, a, m = (cap[k][b].float() for k in ("resid_in", "attn_out", "mlp_out"))
    probs = cap["probs"][b].float()  # (H, N, N)
    values = cap["values"][b].float()  # (H, N, d), grouped-query heads already repeated
    attn = block.attn
    w_o = attn.out.weight.float().view(attn.out.out_features, attn.num_heads, attn.head_dim)  # (D, H, d)
    f = torch.einsum("hnd,ehd->hne", values, w_o)  # (H, N, D): f_h(x_j)
    inv = torch.ones_like(x[:, :1])  # (N, 1): the post-branch norm's frozen 1/scale per query (1: none)
    if not isinstance(block.post_attn_norm, nn.Identity):
        ob = attn.out.bias
        raw = torch.einsum("hij,hjd->id", probs, f) + (ob.float() if ob is not None else 0)
        post = FrozenNorm(block.post_attn_norm, raw)
        f, inv = post.unit(f), post.inv
    ls = getattr(block.ls1, "lambda1", None)
    if ls is not None:
        f = f * ls.float()
    N, D = x.shape
    fnorm = f.abs().sum(-1)  # (H, N): ‖f_h(x_j)‖₁ (before the query's 1/scale)
    heads = probs * fnorm[:, None, :] * inv[None, :, :]  # (H, N, N)
    y = x + a + m if block.parallel else x + a  # the sum the attention step's parts make
    out_attn = torch.zeros(N, N)
    out_resid, out_mlp = torch.zeros(N), torch.zeros(N)
    step = max(1, BLOCK_FLOATS // max(1, N * D))
    for s in range(0, N, step):
        rows = slice(s, min(N, s + step))
        z = torch.einsum("hij,hjd->ijd", probs[:, rows], f) * inv[rows, :, None]  # (n, N, D)
        extra = [x[rows, None], (a[rows] - z.sum(1))[:, None]]  # the residual stream, then the biases
        if block.parallel:
            extra.append(m[rows, None])
        p = proximity(y[rows], torch.cat([z] + extra, dim=1))  # (n, N + 2 or 3)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
        out_attn[rows], out_resid[rows] = p[:, :N], p[:, N]
        if block.parallel:
            out_mlp[rows] = p[:, N + 2]
    if not block.parallel:
        p = proximity(a + x + m, torch.stack([a + x, m], dim=1))  # the MLP step: y_i and m_i
        out_mlp = p[:, 1] / p.sum(-1).clamp_min(1e-30)
    return out_attn, out_resid, out_mlp, heads


def contribution_graph(model: Model, x, run_kw: dict | None = None, progress: Callable | None = None) -> FlowGraph:
    """Every edge's share for text x (or a list of token ids) on a decoder (an api Model)."""
    import torch

    with torch.inference_mode():
        run = residual_run(model, x, run_kw, probs=True, keep="full")
        L = len(run.parts.blocks)
        attn, resid, mlp, heads = [], [], [], []
        for i, block in enumerate(run.parts.blocks):
            a, r, m, h = _layer_shares(block, run.caps[i])
            attn.append(a)
            resid.append(r)
            mlp.append(m)
            heads.append(h.to(torch.float16))
            run.caps[i].clear()  # let the layer's tensors go
            if progress is not None:
                progress((i + 1) / L, f"layer {i} of {L - 1}")
        return FlowGraph(run.tokens, torch.stack(attn).numpy(), torch.stack(resid).numpy(),
                         torch.stack(mlp).numpy(), torch.stack(heads).numpy(), model.info.name, run.notes)


def trace(graph: FlowGraph, position: int = -1, threshold: float = 0.04) -> tuple[list[Edge], set]:
    """The edges whose share reaches `threshold`, followed down from token `position` after the last layer.

    Returns (edges, nodes): nodes are (level, token) pairs reached (level L = the output, 0 = the embeddings)."""
    L, N = graph.attn.shape[:2]
    pos = int(position)
    if not -N <= pos < N:
        raise UserError(f"position {pos} does not exist; the input has positions 0..{N - 1}")
    tau = float(threshold)
    if not 0.0 < tau <= 1.0:
        raise UserError(f"the threshold is a share: between 0 (excluded) and 1, got {threshold}")
    pos %= N
    active, nodes, edges = {pos}, {(L, pos)}, []
    for layer in range(L - 1, -1, -1):
        below = set()
        for i in sorted(active):
            for j in np.flatnonzero(graph.attn[layer, i, : i + 1] >= tau):
                j = int(j)
                head = int(np.argmax(graph.heads[layer, :, i, j]))
                edges.append(Edge(layer, j, i, "attn", float(graph.attn[layer, i, j]), head))
                below.add(j)
            if graph.resid[layer, i] >= tau:
                edges.append(Edge(layer, i, i, "resid", float(graph.resid[layer, i])))
                below.add(i)
        active = below
        nodes |= {(layer, t) for t in below}
    return edges, nodes


def graph_json(graph: FlowGraph, position: int = -1, threshold: float = 0.04) -> dict:
    """The traced graph as plain data (for export)."""
    edges, nodes = trace(graph, position, threshold)
    return {"model": graph.model, "tokens": graph.tokens, "position": int(position) % len(graph.tokens),
            "threshold": float(threshold),
            "edges": [dict(layer=e.layer, src=e.src, dst=e.dst, kind=e.kind, weight=round(e.weight, 6),
                           head=e.head) for e in edges],
            "nodes": sorted([list(n) for n in nodes]), "mlp_share": np.round(graph.mlp.astype(float), 6).tolist()}
