"""The logit lens and direct logit attribution (decoders), on one exact decomposition of the residual stream.

A pre-LN decoder's last residual stream is a sum: the embeddings, plus every block's attention output
(itself a sum over heads, plus W_O's bias) and every block's MLP output. The next-token logits read it
through the final norm and the unembedding W_U. The norm divides by a scale computed from the whole
sum, so it is not linear in the pieces; **with that scale frozen** (taken from the real final residual,
the final norm's input, one scale per position) it is, and the logit of a token t is exactly

    logit_t = Σ_c  W_U[t] · N(c) + W_U[t] · b_norm       N(c) = (c − mean(c)) · γ / s   (LayerNorm)
                                                          N(c) = c · γ / s              (RMSNorm)

summed over the pieces c: the embeddings, each head (its share of W_O), each MLP, the biases. Gemma's
norm after each branch (post_attention_norm, the "sandwich") is frozen the same way, from that branch's
whole output: a head's share is γ ⊙ head / s_branch. Gemma 2's final soft-cap c·tanh(x / c) is not
linear either: attribution decomposes the logit before it, and the lens applies it after.

- `logit_lens(model, x)`: for every layer × position, the top-k next tokens of the residual stream after
  that layer, through the final norm (scale frozen, or each layer's own: `norm="own"`, nostalgebraist's
  original lens) and W_U. The last layer's row is the model's real next-token distribution.
- `logit_attribution(model, x, position, target)`: each head's, each MLP's, the embeddings' and the
  biases' direct contribution to the target token's logit at a position; they add up to that logit.

`decoder_parts`, `FrozenNorm` and `residual_run` (analysis.residual) are shared with `analysis.flow` and
`analysis.why`.
Post-LN decoders (OPT-350m) have no such sum and are refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from attn_explorer.analysis.residual import (DecoderParts, FrozenNorm, ResidualRun, head_pieces, residual_run,
                                             softcapped, token_id, token_texts, unembed)
from attn_explorer.errors import UserError

if TYPE_CHECKING:  # the model is api's (import-linter sees this arrow); torch is imported in the functions
    from attn_explorer.api.model import Model

NORMS = ("frozen", "own")  # the lens's final norm: frozen scale (the attribution's convention), or each layer's own
CONVENTION = ("Final norm's scale frozen from the last layer's output (the final norm's real input), one scale per "
              "position: the residual stream after layer l is read as the last one is, so the pieces add up.")
OWN = "Final norm applied afresh to each layer's residual stream (its own scale): the original logit lens."


# ---- the logit lens ---------------------------------------------------------------------------------------

@dataclass
class LogitLens:
    """For each layer's residual stream (row 0: the embeddings; row l + 1: after layer l) and position."""

    tokens: list[str]  # the input's tokens (N)
    top_ids: np.ndarray  # int64 (L + 1, N, k)
    top_tokens: list  # [[[str]*k]*N]*(L + 1)
    top_probs: np.ndarray  # float32 (L + 1, N, k)
    final_prob: np.ndarray  # float32 (L + 1, N): the probability of the model's own top-1 next token there
    norm: str  # "frozen" or "own"
    convention: str  # one sentence for the screen
    model: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def row_names(self) -> list[str]:
        return ["embeddings"] + [f"after L{i}" for i in range(self.top_ids.shape[0] - 1)]

    def to_json(self) -> dict:
        return {"model": self.model, "tokens": self.tokens, "norm": self.norm, "convention": self.convention,
                "rows": self.row_names, "top_ids": self.top_ids.tolist(), "top_tokens": self.top_tokens,
                "top_probs": np.round(self.top_probs.astype(float), 6).tolist(),
                "final_prob": np.round(self.final_prob.astype(float), 6).tolist(), "notes": self.notes}


def _streams(run: ResidualRun) -> list:
    """The residual stream (N, D) before the first block and after each block."""
    L = len(run.parts.blocks)
    out = [run.caps[0]["resid_in"][0].float()] if 0 in run.caps else None
    if out is None:
        raise UserError("the lens needs every layer's residual stream")
    for i in range(1, L):
        out.append(run.caps[i]["resid_in"][0].float())
    out.append(run.final)
    return out


LENS_BLOCK = 1 << 24  # logits computed at a time (64 MB of float32): Gemma's 262k-token vocabulary × 64 rows


def _read(parts: DecoderParts, h, k: int, best=None):
    """Top-k probabilities and ids of normalised hidden states h (N, D), and the probability of `best` (N,) ids,
    in blocks of rows so that no (N, V) array is made at once."""
    import torch

    V = parts.unembed.shape[0]
    step = max(1, LENS_BLOCK // V)
    vals, idx, got = [], [], []
    for s in range(0, h.shape[0], step):
        p = torch.softmax(softcapped(parts, unembed(parts, h[s:s + step])), -1)
        v, j = p.topk(min(k, V), dim=-1)
        vals.append(v)
        idx.append(j)
        if best is not None:
            got.append(p.gather(-1, best[s:s + step, None])[:, 0])
    return torch.cat(vals), torch.cat(idx), (torch.cat(got) if best is not None else None)


def logit_lens(model: Model, x, run_kw: dict | None = None, k: int = 5, norm: str = "frozen",
               progress: Callable | None = None) -> LogitLens:
    """The top-k next tokens of every layer × position (see the module's docstring for the convention)."""
    import torch

    if norm not in NORMS:
        raise UserError(f"unknown lens norm {norm!r}: use {' or '.join(NORMS)}")
    k = int(k)
    if not 1 <= k <= 50:
        raise UserError(f"top-k must be between 1 and 50, got {k}")
    with torch.inference_mode():
        run = residual_run(model, x, run_kw, keep="none")
        parts = run.parts
        frozen = FrozenNorm(parts.final_norm, run.final)
        streams = _streams(run)
        best = _read(parts, run.hidden.float(), 1)[1][:, 0]  # (N,) the model's own next token
        ids, probs, fin = [], [], []
        for i, s in enumerate(streams):
            if norm == "frozen":
                h = frozen.lin(s) + (frozen.bias if frozen.bias is not None else 0)
            else:
                h = parts.final_norm(s.to(parts.unembed.dtype)).float()
            v, j, b = _read(parts, h, k, best)
            ids.append(j)
            probs.append(v)
            fin.append(b)
            if progress is not None:
                progress((i + 1) / len(streams), f"layer {i} of {len(streams) - 1}")
        top_ids = torch.stack(ids).cpu().numpy()
        texts = [[token_texts(model, row) for row in layer] for layer in top_ids]
        return LogitLens(run.tokens, top_ids, texts, torch.stack(probs).cpu().numpy().astype(np.float32),
                         torch.stack(fin).cpu().numpy().astype(np.float32), norm,
                         CONVENTION if norm == "frozen" else OWN, model.info.name, run.notes)


# ---- direct logit attribution -----------------------------------------------------------------------------

@dataclass
class LogitAttribution:
    """The target token's logit at one position, split into direct contributions (frozen final norm)."""

    tokens: list[str]
    position: int
    target_id: int
    target: str  # the target token as shown
    embeddings: float
    heads: np.ndarray  # float32 (L, H): each head's direct contribution
    mlps: np.ndarray  # float32 (L,)
    biases: float  # W_O biases, the post-branch norms' and the final norm's biases
    logit: float  # the model's real logit (before any soft-cap)
    prob: float  # the model's real probability of the target there
    convention: str = CONVENTION

    @property
    def total(self) -> float:
        """The sum of every piece: equals `logit` (up to float32 rounding)."""
        return float(self.embeddings + self.heads.astype(np.float64).sum() + self.mlps.astype(np.float64).sum()
                     + self.biases)

    def top(self, n: int = 12) -> list[tuple[str, float]]:
        """The n largest pieces by |contribution|, as (name, value): "L3 H1", "MLP 5", "embeddings", "biases"."""
        items = [("embeddings", self.embeddings), ("biases", self.biases)]
        items += [(f"L{layer} H{h}", float(v)) for (layer, h), v in np.ndenumerate(self.heads)]
        items += [(f"MLP {layer}", float(v)) for layer, v in enumerate(self.mlps)]
        return sorted(items, key=lambda t: -abs(t[1]))[:n]

    def to_json(self) -> dict:
        return {"position": self.position, "target_id": self.target_id, "target": self.target,
                "embeddings": self.embeddings, "heads": self.heads.astype(float).round(6).tolist(),
                "mlps": self.mlps.astype(float).round(6).tolist(), "biases": self.biases, "logit": self.logit,
                "sum": self.total, "prob": self.prob, "convention": self.convention}


def attribution_of(run: ResidualRun, position: int, target_id: int):
    """(embeddings, heads (L, H), mlps (L,), biases, logit) as floats and arrays, from a residual run."""
    import torch

    parts = run.parts
    frozen = FrozenNorm(parts.final_norm, run.final[position])
    u = parts.unembed[target_id].float() * parts.logit_scale  # (D_embed,); Cohere's logit_scale (else 1)
    if parts.project_out is not None:
        u = parts.project_out.weight.float().t() @ u  # back through OPT's projection
    read = lambda c: frozen.lin(c) @ u  # noqa: E731 - one line: a piece's direct logit
    emb = float(read(run.caps[0]["resid_in"][0, position]))
    heads, mlps = [], []
    biases = float(frozen.bias @ u) if frozen.bias is not None else 0.0
    for i, block in enumerate(parts.blocks):
        hp, bias = head_pieces(block, run.caps[i], [position])
        heads.append(read(hp[:, 0]))
        mlps.append(read(run.caps[i]["mlp_out"][0, position]))
        if bias is not None:
            biases += float(read(bias[0]))
    logit = float(unembed(parts, run.hidden[position].float())[target_id])
    H = max(h.shape[0] for h in heads)  # hybrids: a layer with fewer heads has zeros past its own, as in the maps
    heads = [torch.cat([h, h.new_zeros(H - h.shape[0], *h.shape[1:])]) if h.shape[0] < H else h for h in heads]
    return emb, torch.stack(heads).cpu().numpy(), torch.stack(mlps).cpu().numpy(), biases, logit


def logit_attribution(model: Model, x, run_kw: dict | None = None, position: int = -1,
                      target: str | int | None = None) -> LogitAttribution:
    """Each piece's direct contribution to the target's logit at `position` (default: the last token;
    target default: the model's own top-1 next token there)."""
    import torch

    with torch.inference_mode():
        run = residual_run(model, x, run_kw)
        n = len(run.tokens)
        pos = int(position)
        if not -n <= pos < n:
            raise UserError(f"position {pos} does not exist; the input has positions 0..{n - 1}")
        pos %= n
        logits = softcapped(run.parts, unembed(run.parts, run.hidden[pos].float()))
        t = int(logits.argmax()) if target is None else token_id(model, target)
        emb, heads, mlps, biases, logit = attribution_of(run, pos, t)
        prob = float(torch.softmax(logits, -1)[t])
        return LogitAttribution(run.tokens, pos, t, token_texts(model, [t])[0], emb, heads.astype(np.float32),
                                mlps.astype(np.float32), biases, logit, prob)


def head_tokens(model: Model, x, run_kw: dict | None, layer: int, head: int, position: int = -1, k: int = 8):
    """Which tokens one head's direct output at `position` promotes and suppresses: its share of W_O there,
    through the frozen final norm and W_U. Returns ([(token, logit)] promoted, [(token, logit)] suppressed)."""
    import torch

    with torch.inference_mode():
        run = residual_run(model, x, run_kw)
        L, n = len(run.parts.blocks), len(run.tokens)
        if not 0 <= int(layer) < L:
            raise UserError(f"layer {layer} does not exist; the model has layers 0..{L - 1}")
        H = run.parts.blocks[int(layer)].attn.num_heads
        if not 0 <= int(head) < H:
            raise UserError(f"head {head} does not exist; the layer has heads 0..{H - 1}")
        pos = int(position) % n
        hp, _ = head_pieces(run.parts.blocks[int(layer)], run.caps[int(layer)], [pos])
        frozen = FrozenNorm(run.parts.final_norm, run.final[pos])
        logits = unembed(run.parts, frozen.lin(hp[int(head), 0]))
        up, down = logits.topk(k), (-logits).topk(k)
        show = lambda idx, vals, sign: list(zip(token_texts(model, idx.tolist()),  # noqa: E731
                                                (sign * vals).tolist()))
        return show(up.indices, up.values, 1.0), show(down.indices, down.values, -1.0)
