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

`decoder_parts`, `FrozenNorm` and `residual_run` are shared with `analysis.flow` and `analysis.why`.
Post-LN decoders (OPT-350m) have no such sum and are refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from attn_explorer.errors import UserError

if TYPE_CHECKING:  # the model is api's (import-linter sees this arrow); torch is imported in the functions
    from attn_explorer.api.model import Model

NORMS = ("frozen", "own")  # the lens's final norm: frozen scale (the attribution's convention), or each layer's own
CONVENTION = ("Final norm's scale frozen from the last layer's output (the final norm's real input), one scale per "
              "position: the residual stream after layer l is read as the last one is, so the pieces add up.")
OWN = "Final norm applied afresh to each layer's residual stream (its own scale): the original logit lens."


# ---- the pieces a decoder is made of ----------------------------------------------------------------------

@dataclass
class DecoderParts:
    """What the decomposition needs from one of our decoders (Llama family, GPT-2)."""

    blocks: list  # TransformerBlock, in order
    final_norm: object  # the norm before W_U (nn.LayerNorm, RMSNorm or nn.Identity)
    project_out: object | None  # OPT's Linear back to the embedding width, else None
    unembed: object  # (V, D_embed) weight tensor of the LM head (the embedding when tied)
    softcap: float | None  # final logit soft-cap (Gemma 2), applied after the decomposition
    module: object = None


def decoder_parts(module) -> DecoderParts:
    """The blocks, final norm and unembedding of a decoder with an LM head; a UserError for anything else."""
    from torch import nn

    cfg = getattr(module, "cfg", None)
    if not getattr(module, "causal", False) or not hasattr(module, "logits") or not hasattr(module, "blocks"):
        raise UserError("the logit lens and contributions need a decoder (SmolLM2, Gemma 3, GPT-2): this model "
                        "has no next-token logits")
    if not getattr(module, "can_generate", True):
        raise UserError("this decoder was loaded without its LM head: it has no next-token logits")
    blocks = list(module.blocks.layers)
    if any(not (b.norm_first or b.parallel) for b in blocks):
        raise UserError("post-LN decoders (OPT-350m) are not supported yet: their residual stream is not a sum")
    if hasattr(module, "embed_tokens"):  # Llama, Gemma
        norm = module.norm
        unembed = module.embed_tokens.weight if cfg.tie_embeddings else module.lm_head.weight
        return DecoderParts(blocks, norm, None, unembed, getattr(cfg, "final_softcap", None), module)
    norm = module.ln_f if module.ln_f is not None else nn.Identity()
    unembed = module.wte.weight if cfg.tie_embeddings else module.lm_head.weight
    return DecoderParts(blocks, norm, module.project_out, unembed, None, module)


class FrozenNorm:
    """A LayerNorm or RMSNorm with its scale frozen at a reference input: then y = lin(x) + bias is linear.

    ref: (..., D), the input whose scale is frozen (one scale per row). `lin(c)` applies the linear part to
    one piece c (..., D) of that input (rows broadcast against ref's); `bias` is the constant (None for
    RMSNorm). Σ lin(c_k) + bias = norm(Σ c_k) exactly when Σ c_k = ref."""

    def __init__(self, norm, ref):
        import torch
        from torch import nn

        from attn_explorer.core.layers import RMSNorm

        x = ref.float()
        self.centre = isinstance(norm, nn.LayerNorm)
        if isinstance(norm, nn.Identity):
            self.inv, self.gain, self.bias = torch.ones_like(x[..., :1]), None, None
        elif self.centre:
            var = x.var(-1, unbiased=False, keepdim=True)
            self.inv = torch.rsqrt(var + norm.eps)
            self.gain = None if norm.weight is None else norm.weight.float()
            self.bias = None if norm.bias is None else norm.bias.float()
        elif isinstance(norm, RMSNorm):
            self.inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
            w = norm.weight.float()
            self.gain, self.bias = (1.0 + w) if norm.unit_offset else w, None
        else:
            raise UserError(f"cannot freeze a {type(norm).__name__}: only LayerNorm and RMSNorm")

    def lin(self, c, inv=None):
        """The linear part applied to piece c; `inv` overrides the frozen 1/scale (rows of it)."""
        c = c.float()
        if self.centre:
            c = c - c.mean(-1, keepdim=True)
        c = c * (self.inv if inv is None else inv)
        return c if self.gain is None else c * self.gain

    def unit(self, c):
        """lin(c) with 1/scale = 1: γ ⊙ (centred) c, to be multiplied by a row's 1/scale later."""
        c = c.float()
        if self.centre:
            c = c - c.mean(-1, keepdim=True)
        return c if self.gain is None else c * self.gain


def branch_norm(block, raw):
    """The frozen post-branch norm (Gemma's post_attention_norm) of an attention output `raw` (N, D), or None."""
    from torch import nn

    if isinstance(block.post_attn_norm, nn.Identity):
        return None
    return FrozenNorm(block.post_attn_norm, raw)


def head_pieces(block, cap, positions=None, b: int = 0):
    """One block's attention output split by head at `positions` (all when None): (heads (H, P, D), bias (P, D)
    or None), each already through the frozen post-branch norm and layerscale, so heads.sum(0) + bias = the
    block's attn_out there. Reads the layer's ctx (W_O's input: hook_z, heads first; see layer_pieces)."""
    import torch

    pos = slice(None) if positions is None else list(positions)
    attn = block.attn
    w_o = attn.out.weight.float().view(attn.out.out_features, attn.num_heads, attn.head_dim)  # (D, H, d)
    heads = torch.einsum("hpd,ehd->hpe", cap["ctx"][b][:, pos].float(), w_o)  # (H, P, D), each head's share
    ob = block.attn.out.bias
    raw = heads.sum(0) + (ob.float() if ob is not None else 0)
    post = branch_norm(block, raw)
    bias = None if ob is None else ob.float().expand_as(raw)
    if post is not None:
        heads = post.lin(heads)
        bias = (post.lin(bias) if bias is not None else 0) + (post.bias if post.bias is not None else 0)
        bias = None if isinstance(bias, int) else bias
    ls = getattr(block.ls1, "lambda1", None)  # DINOv2-style layerscale (none in today's decoders)
    if ls is not None:
        heads = heads * ls.float()
        bias = None if bias is None else bias * ls.float()
    return heads, bias


# ---- one run with the residual stream kept ----------------------------------------------------------------

@dataclass
class ResidualRun:
    """One forward pass with every block's pieces kept (torch tensors; batch 0)."""

    parts: DecoderParts
    ids: list[int]
    tokens: list[str]
    caps: dict  # {layer: layer_pieces}: resid_in, attn_out, mlp_out; ctx; q, k, values (+ probs) where kept
    final: object  # (N, D) float32: the final norm's input (the last block's output)
    hidden: object  # (N, D_embed): what W_U reads (the model's own final hidden state)
    dk_scale: float = 1.0
    dk_layers: list | None = None
    notes: list[str] = field(default_factory=list)


def run_kwargs(run_kw: dict | None) -> tuple[float, list | None, int | None]:
    """(dk_scale, dk_layers, max_tokens) of a GUI or CLI run's keyword arguments; others are refused."""
    run_kw = dict(run_kw or {})
    unknown = set(run_kw) - {"dk_scale", "dk_layers", "max_tokens"}
    if unknown:
        raise UserError(f"this analysis does not take {sorted(unknown)[0]!r}")
    return float(run_kw.get("dk_scale", 1.0)), run_kw.get("dk_layers"), run_kw.get("max_tokens")


def residual_run(model: Model, x, run_kw: dict | None = None, probs: bool = False, layers=None, keep: str = "ctx",
                 full=None) -> ResidualRun:
    """Run `model` (an api Model, a decoder) once on text x, keeping each block's residual pieces.

    One Model.trace keeping named activations (layer_pieces). layers: which layers to keep (all when None).
    keep: what else each keeps: "none" (the residual stream alone: the lens), "ctx" (hook_z, W_O's input, (H, N,
    d) a layer, from which `head_pieces` makes any position's head outputs: attribution) or "full" (also q, k and
    values: the graph). full: layers that keep everything whatever `keep` says (the why-matrix's own layer).
    probs=True also keeps the full layers' attention probabilities (hook_pattern); a UserError says when they
    would not fit in memory."""
    from attn_explorer.budget import attention_maps_bytes, default_budget, human_bytes

    if keep not in ("none", "ctx", "full"):
        raise ValueError(f"keep must be 'none', 'ctx' or 'full', got {keep!r}")
    parts = decoder_parts(model.module)
    dk_scale, dk_layers, max_tokens = run_kwargs(run_kw)
    inputs, tokens, notes = prepared(model, x, max_tokens)
    want = range(len(parts.blocks)) if layers is None else layers
    full = set(want) if keep == "full" else set(full or ())
    if probs and full:
        n, H = len(tokens), parts.blocks[0].attn.num_heads
        need = attention_maps_bytes(n, len(full), H, elem=6)  # float32 maps, and the graph's float16 copy
        budget = default_budget(model.device)
        if need > budget:
            raise UserError(f"{n:,} tokens would need {human_bytes(need)} for every layer's attention maps; only "
                            f"{human_bytes(budget)} can be spared now: use fewer tokens")
    last = len(parts.blocks) - 1
    layers_kept = sorted({int(i) for i in want} | {last})  # the last block's pieces make the final residual
    names = []
    for i in layers_kept:
        names += [f"blocks.{i}.hook_resid_pre", f"blocks.{i}.hook_attn_out", f"blocks.{i}.hook_mlp_out"]
        if i in full or (keep == "ctx" and i in set(want)):
            names.append(f"blocks.{i}.attn.hook_z")
        if i in full:
            names += [f"blocks.{i}.attn.hook_{p}" for p in "qkv"] + ([f"blocks.{i}.attn.hook_pattern"] if probs else [])
    t = model.trace(inputs, names=names, dk_scale=dk_scale, dk_layers=dk_layers)
    caps = {i: layer_pieces(t.cache, i, model.info.num_heads) for i in layers_kept}
    c = caps[last]
    final = (c["resid_in"] + c["attn_out"] + c["mlp_out"])[0].float()
    ids = inputs["input_ids"][0].tolist()
    out = t.out
    return ResidualRun(parts, ids, tokens, caps, final, out.hidden[0], dk_scale, dk_layers, notes)


def layer_pieces(cache, i: int, num_heads: int) -> dict:
    """Block i's kept activations under the names the lens, attribution and graph read: resid_in, attn_out,
    mlp_out (B, N, D); ctx (B, H, N, d: hook_z, heads first); q, k, values (B, H, N, d, grouped-query heads
    repeated); probs (B, H, N, N), each where the run kept it."""
    from attn_explorer.api.hooks import heads_first  # torch: never at import (the window imports this module)

    pre = f"blocks.{i}."
    pieces = {"resid_in": "hook_resid_pre", "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out",
              "probs": "attn.hook_pattern"}
    out = {key: cache[pre + name] for key, name in pieces.items() if pre + name in cache}
    for key, name in (("ctx", "z"), ("q", "q"), ("k", "k"), ("values", "v")):
        if f"{pre}attn.hook_{name}" in cache:
            out[key] = heads_first(cache[f"{pre}attn.hook_{name}"], num_heads)
    return out


def prepared(model: Model, x, max_tokens=None) -> tuple[dict, list[str], list[str]]:
    """(forward inputs, tokens, notes) of text x, or of x given as token ids already (a list of ints)."""
    import torch

    if isinstance(x, (list, tuple)) and x and all(isinstance(i, (int, np.integer)) for i in x):
        vocab = int(decoder_parts(model.module).unembed.shape[0])
        if not all(0 <= int(i) < vocab for i in x):
            raise UserError(f"token ids must lie in 0..{vocab - 1}")
        ids = [int(i) for i in x][: max_tokens or None]
        return {"input_ids": torch.tensor([ids], device=model.device)}, token_texts(model, ids), []
    prep = model.prepare(x, max_tokens=max_tokens)
    if "input_ids" not in prep.inputs:
        raise UserError("the logit lens and contributions need a text decoder")
    return prep.inputs, list(prep.tokens), list(prep.notes)


def unembed(parts: DecoderParts, h):
    """Logits (..., V) of normalised hidden states h (..., D), before any soft-cap."""
    import torch.nn.functional as F

    if parts.project_out is not None:
        h = parts.project_out(h.to(parts.unembed.dtype))
    return F.linear(h.to(parts.unembed.dtype), parts.unembed).float()


def softcapped(parts: DecoderParts, logits):
    import torch

    c = parts.softcap
    return logits if c is None else torch.tanh(logits / c) * c


def token_id(model: Model, target: str | int) -> int:
    """The vocabulary id of one target token, given as an id (an int, or digits) or as text (" Paris");
    a UserError when the text is not exactly one token (hub.text.TextTokenizer.single_token_id)."""
    vocab = int(decoder_parts(model.module).unembed.shape[0])
    if isinstance(target, str) and target.isdigit():
        target = int(target)
    if model.tokenizer is None:
        if isinstance(target, (int, np.integer)) and 0 <= int(target) < vocab:
            return int(target)
        raise UserError("this model has no tokenizer to read the target token with")
    return model.tokenizer.single_token_id(target, vocab, model.info.name)


def token_texts(model: Model, ids) -> list[str]:
    """Each id as the views show tokens."""
    tz = model.tokenizer
    if tz is None:
        return [str(int(i)) for i in ids]
    return tz.display([int(i) for i in ids])


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
    u = parts.unembed[target_id].float()  # (D_embed,)
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
