"""Named hook points: every activation a researcher may read or change has a name, after TransformerLens.

    hook_embed                      (B, N, D)  what the embeddings hand to the first block (tokens, positions,
                                               token types, the embedding norm: the stream before block 0)
    blocks.{i}.hook_resid_pre       (B, N, D)  block i's input
    blocks.{i}.attn.hook_q          (B, N, H, d_head)     queries, after QK-norm and RoPE
    blocks.{i}.attn.hook_k          (B, N, H_kv, d_head)  keys, after QK-norm and RoPE, before grouped-query
                                                          repetition (the new tokens only, with a KV cache)
    blocks.{i}.attn.hook_v          (B, N, H_kv, d_head)  values, before grouped-query repetition
    blocks.{i}.attn.hook_pattern    (B, H, N, M)          the probabilities softmax(QK^T/sqrt(d_k))
    blocks.{i}.attn.hook_z          (B, N, H, d_head)     every head's output before W_O
    blocks.{i}.hook_attn_out        (B, N, D)  the attention branch's addition to the stream (after W_O, and
                                               after LayerScale / Gemma's post-attention norm; post-LN blocks:
                                               before the norm)
    blocks.{i}.mlp.hook_expert_indices  (B, N, k)  MoE layers only (core.moe): each token's k chosen experts, int64
    blocks.{i}.mlp.hook_expert_weights  (B, N, k)  MoE layers only: their routing weights (after top-k, any
                                                   renormalising and scaling: what multiplies each expert)
    blocks.{i}.hook_mlp_out         (B, N, D)  the MLP branch's addition, the same way
    blocks.{i}.hook_resid_post      (B, N, D)  block i's output
    hook_final                      (B, N, D)  the last hidden state, after the final norm (api floor)
    hook_logits                     (B, N, V)  next-token logits, decoders with an LM head (api floor)

A hook is `fn(tensor, name)`; it may return a tensor of the same shape, which replaces the activation
for everything downstream, or None to leave it. q, k, v and z are handed over in TransformerLens's
(B, N, heads, d_head) layout as views of the module's own (B, heads, N, d_head) tensors: a replacement
is transposed back. `Hooks` is what one forward pass carries down the stack (a frozen value, made by
the api floor); each block reads its part through `Hooks.layer(i)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import torch

HookFn = Callable[[torch.Tensor, str], Optional[torch.Tensor]]

# A block's hook points, relative to "blocks.{i}.", in the order a forward pass reaches them.
BLOCK_POINTS = ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_pattern", "attn.hook_z",
                "hook_attn_out", "hook_mlp_out", "hook_resid_post")
# Points handed over in (B, N, heads, d_head) while the module holds (B, heads, N, d_head).
# An MoE layer's routing (core.moe), reached inside its MLP, before hook_mlp_out (TransformerLens's MoE names).
MOE_POINTS = ("mlp.hook_expert_indices", "mlp.hook_expert_weights")
HEAD_MAJOR = frozenset({"attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z"})
# Hybrids (core.recurrent): a recurrent layer has the block's points (attn.hook_pattern is its implicit map, hook_z
# its heads' input to the output projection) plus its mixer's own, reached before attn.hook_pattern, by
# ModelInfo.mixers kind. Gated DeltaNet (core.deltanet): hook_beta (B, N, H_v) the write strength β, hook_decay
# (B, N, H_v) the log decay g (<= 0; the state is times exp(g) per token).
MIXER_POINTS: dict[str, tuple[str, ...]] = {
    "softmax": (),
    "deltanet": ("attn.hook_beta", "attn.hook_decay"),
    # Mamba-2 (core.mamba2; hook_q / hook_k are C / B per group): hook_dt (B, N, H) each head's step after softplus
    "mamba2": ("attn.hook_dt",),
}


def hook_names(num_layers: int, logits: bool = False, moe_layers=(), mixers=()) -> list[str]:
    """Every hook point of a stack of num_layers blocks, in the order a forward pass reaches them.
    moe_layers: per layer, True where its MLP is routed experts (MOE_POINTS join that block's points).
    mixers: per layer its mixer's kind (ModelInfo.mixers; MIXER_POINTS join a recurrent layer's points)."""
    names = ["hook_embed"]
    for i in range(num_layers):
        points = BLOCK_POINTS
        extra = MIXER_POINTS.get(mixers[i], ()) if i < len(mixers) else ()
        if extra:
            at = points.index("attn.hook_pattern")
            points = points[:at] + extra + points[at:]
        if i < len(moe_layers) and moe_layers[i]:
            at = points.index("hook_mlp_out")
            points = points[:at] + MOE_POINTS + points[at:]
        names += [f"blocks.{i}.{p}" for p in points]
    return names + ["hook_final"] + (["hook_logits"] if logits else [])


class HookError(ValueError):
    """A hook returned something that cannot replace its activation."""


def call_hooks(fns: tuple[HookFn, ...], name: str, x: torch.Tensor) -> torch.Tensor:
    """Run each hook on x in order; one that returns a tensor replaces x for the next and downstream."""
    for fn in fns:
        y = fn(x, name)
        if y is None:
            continue
        if not isinstance(y, torch.Tensor):
            raise HookError(f"the hook on {name} returned {type(y).__name__}; return a tensor or None")
        if y.shape != x.shape:
            raise HookError(f"the hook on {name} returned shape {tuple(y.shape)}; it must keep {tuple(x.shape)}")
        x = y.to(x.dtype)
    return x


@dataclass(frozen=True)
class KeptLayer:
    """What a lazy layer keeps instead of its maps (core.lazy): q (B, H, N, d), k (B, H_kv, M, d), each
    row's log-sum-exp (B, H, N) and the options its tiles recompute the logits with."""

    q: torch.Tensor
    k: torch.Tensor
    lse: torch.Tensor
    options: object  # lazy.LayerOptions


@dataclass(frozen=True)
class Hooks:
    """The hook functions of one forward pass, by point name, and whether its layers keep q, k and lse
    instead of their maps (lazy attention: they land in `kept`, {layer: KeptLayer})."""

    fns: Mapping[str, tuple[HookFn, ...]] = field(default_factory=dict)
    keep: bool = False
    kept: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        layers = set()
        for name in self.fns:
            if name.startswith("blocks."):
                layers.add(int(name.split(".", 2)[1]))
        object.__setattr__(self, "_layers", frozenset(layers))

    def wants(self, name: str) -> bool:
        return name in self.fns

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        fns = self.fns.get(name)
        return x if not fns else call_hooks(fns, name, x)

    def layer(self, i: int) -> "LayerHooks | None":
        """Block i's view of these hooks; None where it has nothing to do (no hook, not lazy)."""
        if self.keep or i in self._layers:
            return LayerHooks(self, i)
        return None


@dataclass(frozen=True)
class LayerHooks:
    """One block's hook points ("hook_resid_pre", "attn.hook_z", ...: see BLOCK_POINTS)."""

    hooks: Hooks
    index: int

    @property
    def keep(self) -> bool:
        return self.hooks.keep

    def wants(self, point: str) -> bool:
        return f"blocks.{self.index}.{point}" in self.hooks.fns

    def __call__(self, point: str, x: torch.Tensor) -> torch.Tensor:
        """x after the hooks on this block's `point`; x itself when there are none. q, k, v and z are given
        as (B, N, heads, d) and a replacement comes back as (B, heads, N, d)."""
        name = f"blocks.{self.index}.{point}"
        fns = self.hooks.fns.get(name)
        if not fns:
            return x
        if point in HEAD_MAJOR:
            return call_hooks(fns, name, x.transpose(1, 2)).transpose(1, 2)
        return call_hooks(fns, name, x)

    def store(self, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, options) -> None:
        self.hooks.kept[self.index] = KeptLayer(q, k, lse, options)
