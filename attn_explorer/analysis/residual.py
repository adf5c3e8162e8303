"""One decoder run with its residual stream kept, split into the pieces the lens, attribution, the graph and
the why-matrix read (analysis.lens, analysis.flow, analysis.why): the decoder's parts, the frozen norms that make
the final norm linear in those pieces, each head's share of W_O, and `residual_run`, one Model.trace that keeps
the named activations (blocks.{i}.hook_resid_pre / hook_attn_out / hook_mlp_out, attn.hook_z, ...)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from attn_explorer.errors import UserError

if TYPE_CHECKING:  # the model is api's (import-linter sees this arrow); torch is imported in the functions
    from attn_explorer.api.model import Model


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
    logit_scale: float = 1.0  # every logit times this (Cohere's logit_scale), the pieces' shares too


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
    if getattr(cfg, "mamba", None) is not None:  # Granite 4 hybrid, Falcon-H1 (core.mamba_hybrid)
        raise UserError(f"the logit lens and contributions do not support {cfg.family} yet: its Mamba-2 mixers (and "
                        "their gated norm and multipliers) act outside the pieces this decomposition sums")
    scaled = [f for f in ("residual_multiplier", "logits_divisor") if getattr(cfg, f, 1.0) != 1.0]
    if scaled:  # Granite: each branch and the logits are scaled outside the pieces this decomposition sums
        raise UserError(f"the logit lens and contributions do not support Granite's multipliers yet "
                        f"({', '.join(scaled)} ≠ 1): its pieces would not add up to the logit")
    if getattr(cfg, "per_layer_dim", None) or any(getattr(b, "layer_scalar", None) is not None for b in blocks):
        raise UserError("the logit lens and contributions do not support Gemma 4 yet: its layer scalars (and "
                        "per-layer inputs) act outside the pieces this decomposition sums")
    if hasattr(module, "embed_tokens"):  # Llama, Gemma
        norm = module.norm
        unembed = module.embed_tokens.weight if cfg.tie_embeddings else module.lm_head.weight
        return DecoderParts(blocks, norm, None, unembed, getattr(cfg, "final_softcap", None), module,
                            logit_scale=getattr(cfg, "logit_scale", 1.0))
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
    logits = F.linear(h.to(parts.unembed.dtype), parts.unembed).float()
    return logits if parts.logit_scale == 1.0 else logits * parts.logit_scale  # Cohere's logit_scale


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
    return model.tokenizer.single_token_id(target, vocab)


def token_texts(model: Model, ids) -> list[str]:
    """Each id as the views show tokens."""
    tz = model.tokenizer
    if tz is None:
        return [str(int(i)) for i in ids]
    return tz.display([int(i) for i in ids])
