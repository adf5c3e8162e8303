"""The hook API's plain parts: which names a model has, the cache `run_with_cache` fills, and the one
engine that replaces heads' outputs (ablation and patching: `head_hook`).

The names and shapes are core.hooks's (after TransformerLens): `hook_embed`, `blocks.{i}.hook_resid_pre`,
`blocks.{i}.attn.hook_q|k|v|pattern|z`, `blocks.{i}.hook_attn_out`, `blocks.{i}.hook_mlp_out`,
`blocks.{i}.hook_resid_post`, `hook_final`, and `hook_logits` for decoders with an LM head; on an MoE model's
MoE layers also `blocks.{i}.mlp.hook_expert_indices` and `.hook_expert_weights` (its routing: api.routing).
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from attn_explorer.api.lazy import LazyAttention
from attn_explorer.core.hooks import HookFn, hook_names
from attn_explorer.errors import UserError
from attn_explorer.validate import existing_head

ABLATIONS = ("zero", "mean")  # how a head is switched off: its output before W_O set to 0, or to its mean


def model_hook_names(info) -> list[str]:
    """Every hook point of a model described by info (api.result.ModelInfo), in forward order. An
    encoder-decoder's are its encoder's."""
    return hook_names(info.num_layers, logits=bool(info.causal and info.can_generate and not info.encoder_decoder),
                      moe_layers=info.moe_layers, mixers=getattr(info, "mixers", ()))


def heads_of(info, layer: int) -> int:
    """How many heads layer has (ModelInfo.layer_heads on a hybrid, else num_heads)."""
    lh = getattr(info, "layer_heads", ())
    return lh[layer] if lh else info.num_heads


def check_names(names: Iterable[str], valid: list[str]) -> None:
    """Refuse, in one line, a name that is not a hook point of this model (with the nearest one)."""
    known = set(valid)
    for name in names:
        if not isinstance(name, str):
            raise UserError(f"hook names are strings such as 'blocks.0.attn.hook_z', got {name!r}")
        if name not in known:
            near = difflib.get_close_matches(name, valid, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else " (m.hook_names() lists them)"
            raise UserError(f"{name!r} is not a hook point of this model{hint}")


def select_names(names, valid: list[str]) -> list[str]:
    """run_with_cache's `names`: None (every point), a list of names, or a callable name -> bool."""
    if names is None:
        return list(valid)
    if callable(names):
        return [n for n in valid if names(n)]
    if isinstance(names, str):
        names = [names]
    names = list(names)
    check_names(names, valid)
    return names


class ActivationCache(Mapping):
    """What run_with_cache kept: hook name -> tensor (detached, on the model's device and in its dtype;
    `numpy(name)` gives float32 NumPy). A name that was not kept is refused in one line."""

    def __init__(self, store: dict[str, torch.Tensor], valid: list[str]):
        self._store = store
        self._valid = valid

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._store[name]
        except KeyError:
            if name in self._valid:
                raise KeyError(f"{name!r} was not cached in this run: ask for it in run_with_cache(names=...)") from None
            near = difflib.get_close_matches(str(name), self._valid, n=1)
            raise KeyError(f"{name!r} is not a hook point" + (f" (did you mean {near[0]!r}?)" if near else "")) from None

    def __iter__(self):
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def numpy(self, name: str):
        return self[name].detach().float().cpu().numpy()

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} tensors: {', '.join(list(self._store)[:4])}{', …' if len(self) > 4 else ''})"


def heads_first(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """A cached q, k, v or z (B, N, heads, d) as (B, H, N, d), grouped-query keys and values repeated to
    every query head (kv head h // (H / H_kv))."""
    t = t.transpose(1, 2)
    r = num_heads // t.shape[1]
    return t if r == 1 else t.repeat_interleave(r, dim=1)


@dataclass
class Trace:
    """What `Model.trace` returns: the module's output (hidden after hook_final; attentions when asked),
    the activations kept, the forward's time, the next-token logits where hook_logits was hooked or kept,
    and a lazy forward's store (api.lazy.LazyAttention)."""

    out: object
    cache: ActivationCache
    ms: float
    logits: torch.Tensor | None = None
    lazy: LazyAttention | None = None
    routing: object = None  # MoE models: the first input's api.result.Routing (api.routing); None for dense ones


def caching_hook(store: dict, detach: bool = True) -> HookFn:
    """A hook that keeps what it sees in store[name] (detached, unless autograd is wanted) and changes nothing."""

    def keep(x: torch.Tensor, name: str) -> None:
        store[name] = x.detach() if detach else x

    return keep


def merge(*tables: Mapping[str, Callable] | None) -> dict[str, tuple[HookFn, ...]]:
    """Several {name: fn or [fns]} tables as one {name: (fns...)}, in the order given."""
    out: dict[str, tuple] = {}
    for table in tables:
        for name, fns in (table or {}).items():
            fns = tuple(fns) if isinstance(fns, (list, tuple)) else (fns,)
            for fn in fns:
                if not callable(fn):
                    raise UserError(f"the hook for {name!r} is not a function: {fn!r}")
            out[name] = out.get(name, ()) + fns
    return out


# ---- the one engine that replaces heads' outputs --------------------------------------------------------

def head_hook(edits: list) -> HookFn:
    """A hook for blocks.{i}.attn.hook_z: z (B, N, H, d_head) -> the same with, for each (mask, source) of
    edits in turn, the cells where `mask` (bool, broadcastable to (B, N, H, 1)) is True replaced by
    `source`: "zero" (0), "mean" (that head's output averaged over this input's positions) or a tensor
    broadcastable to z (patching: the same head's output in another run)."""

    def hook(z: torch.Tensor, name: str) -> torch.Tensor:
        for mask, source in edits:
            if isinstance(source, str):
                repl = z.new_zeros(()) if source == "zero" else z.mean(dim=1, keepdim=True)  # (B, 1, H, d)
            else:
                repl = source.to(device=z.device, dtype=z.dtype)
            z = torch.where(mask.to(z.device), repl, z)
        return z

    return hook


def head_mask(heads: Iterable[int], num_heads: int) -> torch.Tensor:
    """bool (1, 1, H, 1): True for the given heads (every copy, every position)."""
    m = torch.zeros(1, 1, num_heads, 1, dtype=torch.bool)
    m[0, 0, list(heads)] = True
    return m


def ablation_hooks(ablate: dict, info) -> dict[str, HookFn]:
    """{(layer, head): "zero" | "mean"} -> {"blocks.{layer}.attn.hook_z": hook} (Model.run's ablate). A bad
    layer, head or kind is one UserError line."""
    if info.encoder_decoder:
        raise UserError("switching heads off is not supported yet for encoder-decoders (BART)")
    per_layer: dict[int, dict[str, list[int]]] = {}
    for key, how in dict(ablate).items():
        try:
            layer, head = (int(v) for v in key)
        except (TypeError, ValueError):
            raise UserError(f"ablate takes {{(layer, head): 'zero' | 'mean'}}, got the key {key!r}") from None
        existing_head(layer, head, info.num_layers, heads_of(info, layer), info.name)
        if how not in ABLATIONS:
            raise UserError(f"unknown ablation {how!r} for L{layer} H{head}: use 'zero' or 'mean'")
        per_layer.setdefault(layer, {}).setdefault(how, []).append(head)
    return {f"blocks.{layer}.attn.hook_z": head_hook([(head_mask(hs, heads_of(info, layer)), how)
                                                       for how, hs in kinds.items()])
            for layer, kinds in per_layer.items()}
