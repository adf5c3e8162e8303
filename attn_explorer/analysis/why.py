"""Why does this head look there? One attention logit split by who wrote the query's and the key's stream.

Head h of layer l scores query i against key j with s_ij = scale · q_i · k_j (before the mask, the softmax and
any soft-cap), where q_i = RoPE_i(W_Q N(x_i) + b_Q) and k_j = RoPE_j(W_K N(x_j) + b_K), N being the layer's
input norm. The residual stream x_p is a sum of what was written into it: the embeddings (GPT-2: the token
and the position embeddings apart), each earlier head, each earlier MLP, and the biases. With N's scale
frozen at the real x_p (as in analysis.lens), and the per-head q/k norms (Gemma 3, Qwen3) frozen at the real
q_i and k_j, everything between a writer and the logit is linear, RoPE included: it is one rotation per
position, applied to each writer's projection at that position. So

    s_ij = Σ_a Σ_b  scale · q_i[a] · k_j[b]          (a: a writer into x_i, b: a writer into x_j)

and the writer × writer matrix sums to the cell's logit. "biases" holds what no writer owns: W_O's biases,
N's bias (LayerNorm) and b_Q / b_K.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from attn_explorer.analysis.residual import FrozenNorm, head_pieces, residual_run
from attn_explorer.errors import UserError

if TYPE_CHECKING:  # the model is api's (import-linter sees this arrow); torch is imported in the functions
    from attn_explorer.api.model import Model

CONVENTION = ("Layer norms' scales frozen at the real residual stream (and q/k norms at the real q and k); RoPE "
              "applied to each writer's projection at its position; the logit before the mask and softmax.")


@dataclass
class WhyMatrix:
    """One attention logit split by writer: matrix[a, b] = the query writer a's part · the key writer b's part."""

    layer: int
    head: int
    query: int
    key: int
    tokens: list[str]
    writers: list[str]  # "embeddings" (or "token embedding", "position embedding"), "L3 H1", "MLP 2", "biases"
    heads: list  # per writer: (layer, head) for a head, else None
    matrix: np.ndarray  # float64 (K, K): rows = writers into the query's stream, columns = into the key's
    logit: float  # the cell's real logit, from the model's own q and k
    convention: str = CONVENTION
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return float(self.matrix.sum())

    def condensed(self, n: int = 12) -> tuple[list[str], list, np.ndarray]:
        """The n writers that matter most (by the larger of |row sum| and |column sum|) in writer order, and one
        "all others" row and column holding the rest, so the smaller matrix still sums to the logit."""
        k = len(self.writers)
        if k <= n + 1:
            return list(self.writers), list(self.heads), self.matrix.copy()
        weight = np.maximum(np.abs(self.matrix.sum(1)), np.abs(self.matrix.sum(0)))
        keep = np.sort(np.argsort(-weight, kind="stable")[:n])
        rest = np.setdiff1d(np.arange(k), keep)
        out = np.zeros((n + 1, n + 1))
        out[:n, :n] = self.matrix[np.ix_(keep, keep)]
        out[:n, n] = self.matrix[np.ix_(keep, rest)].sum(1)
        out[n, :n] = self.matrix[np.ix_(rest, keep)].sum(0)
        out[n, n] = self.matrix[np.ix_(rest, rest)].sum()
        return ([self.writers[i] for i in keep] + [f"all others ({len(rest)})"],
                [self.heads[i] for i in keep] + [None], out)

    def to_json(self) -> dict:
        return {"layer": self.layer, "head": self.head, "query": self.query, "key": self.key, "writers": self.writers,
                "matrix": self.matrix.round(6).tolist(), "logit": self.logit, "sum": self.total,
                "convention": self.convention, "notes": self.notes}


def _qk_rows(attn, h: int):
    """(W_Q (d, D), b_Q (d,) or None, W_K, b_K) of query head h and the key head it reads."""
    d, H, Hkv = attn.head_dim, attn.num_heads, attn.num_kv_heads
    g = h // (H // Hkv)
    if not attn.fused_qkv:
        q, k = attn.query, attn.key
        bq = None if q.bias is None else q.bias[h * d:(h + 1) * d]
        bk = None if k.bias is None else k.bias[g * d:(g + 1) * d]
        return q.weight[h * d:(h + 1) * d], bq, k.weight[g * d:(g + 1) * d], bk
    w, b = attn.qkv.weight, attn.qkv.bias
    if attn.qkv_layout == "per_head":  # head 0's q, k, v rows, then head 1's...
        w = w.view(H, 3, d, -1)
        bb = None if b is None else b.view(H, 3, d)
        return w[h, 0], None if bb is None else bb[h, 0], w[h, 1], None if bb is None else bb[h, 1]
    q0, k0 = h * d, H * d + g * d
    return (w[q0:q0 + d], None if b is None else b[q0:q0 + d], w[k0:k0 + d], None if b is None else b[k0:k0 + d])


def _writers(run, layer: int, positions: tuple[int, int]):
    """(names, heads, pieces (K, 2, D), biases (2, D)): what every writer put into x at the two positions."""
    import torch

    caps, blocks, module = run.caps, run.parts.blocks, run.parts.module
    p = list(positions)
    emb = caps[0]["resid_in"][0, p].float()  # (2, D)
    names, heads, pieces = [], [], []
    wpe = getattr(module, "wpe", None)
    if wpe is not None:  # GPT-2 / OPT: the position embeddings apart from the tokens'
        pos = wpe.weight[torch.tensor(p) + module.cfg.position_offset].float()
        names += ["token embedding", "position embedding"]
        heads += [None, None]
        pieces += [emb - pos, pos]
    else:
        names.append("embeddings")
        heads.append(None)
        pieces.append(emb)
    biases = torch.zeros_like(emb)
    for li in range(layer):
        hp, bias = head_pieces(blocks[li], caps[li], p)  # (H, 2, D): the two positions only
        for h in range(hp.shape[0]):
            names.append(f"L{li} H{h}")
            heads.append((li, h))
            pieces.append(hp[h])
        names.append(f"MLP {li}")
        heads.append(None)
        pieces.append(caps[li]["mlp_out"][0, p].float())
        if bias is not None:
            biases = biases + bias
    return names, heads, torch.stack(pieces), biases


def _side(norm, qk_norm, w, b, pieces, bias, x_real, rope, scale_side: float = 1.0, layout: str = "half",
          rms_after_rope: float | None = None):
    """One side (query or key) at one position: each writer's part of q (or k), (K + 1, d), biases last.
    rms_after_rope (Llama 4's use_qk_norm, its eps): the rotated parts over the RMS of their sum, frozen."""
    import torch

    from attn_explorer.core.positional import apply_rope

    frozen = FrozenNorm(norm, x_real)
    parts = torch.cat([frozen.lin(pieces), frozen.lin(bias)[None]], dim=0) @ w.float().t()  # (K + 1, d)
    const = (frozen.bias @ w.float().t() if frozen.bias is not None else 0) + (b.float() if b is not None else 0)
    parts[-1] = parts[-1] + const
    if qk_norm is not None:
        parts = FrozenNorm(qk_norm, parts.sum(0)).lin(parts)
    if rope is not None:
        parts = apply_rope(parts, rope, layout)
    if rms_after_rope is not None:
        parts = parts * torch.rsqrt(parts.sum(0).pow(2).mean() + rms_after_rope)
    return parts * scale_side


def why_matrix(model: Model, x, run_kw: dict | None, layer: int, head: int, query: int, key: int,
               progress=None) -> WhyMatrix:
    """The writer × writer split of head (layer, head)'s logit for query token `query` and key token `key`.
    progress(fraction, message), if given, hears of the forward pass (half) and of the split (the rest)."""
    import torch

    from attn_explorer.core.attention import attention_scale

    L, H = model.info.num_layers, model.info.num_heads
    layer, head, query, key = int(layer), int(head), int(query), int(key)
    if not 0 <= layer < L:
        raise UserError(f"layer {layer} does not exist; the model has layers 0..{L - 1}")
    if not 0 <= head < H:
        raise UserError(f"head {head} does not exist; the layer has heads 0..{H - 1}")
    cfg = getattr(model.module, "cfg", None)
    if getattr(cfg, "qk_norm_full", False) or not getattr(cfg, "pre_norms", True):
        raise UserError(f"why this head looks there is not supported yet for {model.info.family}: it normalises q and k "
                        "over all heads at once, after no norm before attention, and the split is per head")
    if getattr(cfg, "mla", None) is not None:  # DeepSeek-V3
        raise UserError(f"why this head looks there is not supported yet for {model.info.family}: its q and k are "
                        "rebuilt from normalised latents (multi-head latent attention), which the split does not follow")
    with torch.inference_mode():
        run = residual_run(model, x, run_kw, layers=range(layer + 1), full={layer})
        if progress is not None:
            progress(0.5, "forward pass done")
        n = len(run.tokens)
        for what, v in (("query", query), ("key", key)):
            if not 0 <= v < n:
                raise UserError(f"{what} {v} does not exist; the input has positions 0..{n - 1}")
        if key > query:
            raise UserError(f"key {key} comes after query {query}: a decoder's head never sees it")
        block, module = run.parts.blocks[layer], run.parts.module
        attn, cfg = block.attn, module.cfg
        names, heads, pieces, biases = _writers(run, layer, (query, key))
        x_real = run.caps[layer]["resid_in"][0, [query, key]].float()
        wq, bq, wk, bk = _qk_rows(attn, head)
        notes = []
        window = (getattr(cfg, "sliding_windows", None) or [None] * L)[layer]
        rope = None
        nope = (getattr(cfg, "nope_layers", None) or [False] * L)[layer]  # SmolLM3: no RoPE on this layer
        if hasattr(module, "rope") and not nope:
            cos, sin = module.rope(0, n, x_real.device, x_real.dtype, local=bool(window) and
                                   getattr(cfg, "rope_local_theta", None) is not None)
            rope = {p: (cos[p:p + 1], sin[p:p + 1]) for p in (query, key)}
        if window and query - key >= window:
            notes.append(f"key {key} lies outside this local layer's {window}-token window: the head never uses it")
        chunk = getattr(cfg, "attention_chunk", None) if (getattr(cfg, "chunked_layers", None) or [0] * L)[layer] else None
        if chunk and key // chunk != query // chunk:  # Llama 4's chunked layers
            notes.append(f"key {key} lies outside query {query}'s {chunk}-token chunk on this layer: the head never "
                         "uses it")
        tuning = getattr(cfg, "temperature_tuning", None)
        tuned = 1.0  # Llama 4: its NoPE layers' queries times their position's temperature (hook_q holds it)
        if nope and tuning:
            tuned = math.log1p(math.floor((query + 1) / tuning[0])) * tuning[1] + 1
        if getattr(cfg, "attn_softcap", None):
            notes.append("this model soft-caps the logits: the split is of the logit before the cap")
        dk_on = run.dk_layers is None or layer in set(run.dk_layers)
        scale = attention_scale(attn.head_dim, run.dk_scale if dk_on else 1.0, getattr(cfg, "attn_scale", None))
        post = getattr(attn, "qk_rms_after_rope", None)
        q_norm, k_norm = attn.q_norm, attn.k_norm
        if hasattr(q_norm, "head"):  # Command R+: each head's own q/k norm (its key/value head's for k)
            q_norm, k_norm = q_norm.head(head), k_norm.head(head // (attn.num_heads // attn.num_kv_heads))
        qs = _side(block.norm1, q_norm, wq, bq, pieces[:, 0], biases[0], x_real[0],
                   None if rope is None else rope[query], scale * tuned, attn.rope_layout, post)
        ks = _side(block.norm1, k_norm, wk, bk, pieces[:, 1], biases[1], x_real[1],
                   None if rope is None else rope[key], layout=attn.rope_layout, rms_after_rope=post)
        matrix = (qs.double() @ ks.double().t()).cpu().numpy()  # (K + 1, K + 1)
        c = run.caps[layer]
        real = float((c["q"][0, head, query].double() @ c["k"][0, head, key].double()) * scale)
        if progress is not None:
            progress(1.0, "split")
        return WhyMatrix(layer, head, query, key, run.tokens, names + ["biases"], heads + [None], matrix, real,
                         notes=notes + run.notes)
