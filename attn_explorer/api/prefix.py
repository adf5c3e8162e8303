"""Prefix reuse: an edit near the end of a long prompt costs about as much as the tokens it changed.

In a causal model token i sees only tokens 0..i, so when the next run's token ids start with the same p
ids as the last run's, nothing about those p tokens changes: their keys and values (the KV cache),
their hidden states and their rows of every map. `Model.run(x, reuse_prefix=True)` keeps the last run's
cache here, cuts it to the common prefix, and runs only the tokens from the first changed one on,
attending to the cached ones; the new result's first p rows come from the last result.

Only the newest run is kept, of whichever model made it: SmolLM2's cache of 8,192 tokens is about 380 MB,
so a second one would be memory nobody asked for. Reuse needs the same module (a model switch or a dtype
reload makes a new one), the same d_k setting and no interventions; anything else runs every token and
replaces what is kept. An encoder's token sees every other, so an edit anywhere changes every row:
nothing can be reused there, and the result says so (`RunResult.reuse`).
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from attn_explorer.api.lazy import LazyAttention, LazyLayer
from attn_explorer.api import routing
from attn_explorer.api.result import RunResult
from attn_explorer.core.attention import KVCache


@dataclass
class _Kept:
    """The last reusable run: what the next one may start from."""

    module: weakref.ref  # the module that made it (a new load is a new module)
    key: tuple  # (dtype, dk_scale, dk_layers): settings every row depends on
    ids: list[int]  # its token ids
    cache: KVCache  # every layer's keys and values of those tokens
    hidden: torch.Tensor  # (N, D) last hidden state of those tokens
    result: RunResult  # its maps (the rows before an edit are copied from here)


_kept: _Kept | None = None
_lock = threading.Lock()  # runs are one at a time in the session; a script's threads may not be


def forget() -> None:
    """Drop the kept run (its cache and maps)."""
    global _kept
    _kept = None


def kept_tokens() -> int:
    """Tokens of the kept run (0: none)."""
    return 0 if _kept is None else len(_kept.ids)


def reusable(model) -> bool:
    """Whether this model's runs can start from a kept prefix: a decoder (causal, with a KV cache) reading
    token ids alone."""
    info = model.info
    return (info.modality == "text" and info.causal and not info.encoder_decoder and model._encode is None
            and hasattr(model.module, "new_cache"))


def encoder_line(n: int) -> str:
    """What the status bar says for an encoder, whose every edit recomputes everything."""
    return f"encoder: each edit recomputes all {n:,} tokens (every token sees every other)"


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids a and b share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def _start(model, key: tuple, ids: list[int]) -> tuple[int, str]:
    """(p, why): how many of ids the kept run already has (at most all but the last token: a run needs
    at least one new token), and, when none, why in words."""
    k = _kept
    if k is None:
        return 0, "nothing kept from an earlier run"
    if k.module() is not model.module:
        return 0, "another model ran last"
    if k.key[:3] != key[:3]:
        return 0, "the d_k setting or the dtype changed"
    if k.key != key:
        return 0, "the last run kept its maps the other way (whole maps or q and k)"
    p = min(common_prefix(k.ids, ids), len(ids) - 1)
    return p, "" if p else "the first token changed"


def not_reused(model, n: int, hooked: bool) -> str:
    """A run with reuse_prefix asked that reuses nothing (an encoder, a model without a KV cache, or hooks on:
    an intervention or a cache must see every token): forget what was kept (it would only hold memory), and
    say why in the status bar's words."""
    forget()
    if not model.info.causal:
        return encoder_line(n)
    return f"reused 0 of {n:,} tokens ({'interventions on' if hooked else 'this model keeps no KV cache'})"


def run(model, prep, dk_scale: float, dk_layers, hidden: bool, lazy: bool = False) -> RunResult:
    """`model.run(text, ..., reuse_prefix=True)` for a decoder (`reusable`) with no hook on: the forward of the
    tokens after the kept prefix only (Model.trace), spliced with the kept run's rows (dense maps, or for a
    lazy run q and lse) into a result equal to a full run's; none kept: every token, into a new cache. The
    run is kept in turn for the next."""
    global _kept
    ids = [int(i) for i in prep.inputs["input_ids"][0].tolist()]
    key = (str(model.dtype), float(dk_scale), None if dk_layers is None else tuple(dk_layers), bool(lazy))
    with _lock:
        p, why = _start(model, key, ids)
        kept = _kept
        cache = kept.cache if p else model.module.new_cache()
        _kept = None  # the cache changes now: until this run succeeds there is nothing safe to reuse
        if p:
            try:
                cache.truncate(p)
            except ValueError:  # hybrids (core.recurrent): a recurrent state cannot forget tokens; run them all
                p, why, cache = 0, "a recurrent layer cannot go back to an earlier token", model.module.new_cache()
        t = model.trace({"input_ids": prep.inputs["input_ids"][:, p:], "cache": cache}, dk_scale=dk_scale,
                        dk_layers=dk_layers, attentions=not lazy, lazy=lazy)
        out, ms = t.out, t.ms
        full_hidden = out.hidden[0] if not p else torch.cat([kept.hidden[:p], out.hidden[0]])
        old = kept.result if p else None
        if lazy:
            maps = SimpleNamespace(lazy=_spliced_store(old.lazy if old is not None else None, out.lazy, p))
        else:
            maps = SimpleNamespace(attentions=_spliced(old.attentions if old is not None else None,
                                                       out.attentions[0], p)[None])
        maps.hidden = full_hidden[None]
        line = f"reused {p:,} of {len(ids):,} tokens" + ("" if p else f" ({why})")
        r = model._result(maps, ms, prep.tokens, prep.special, dk_scale, hidden, truncated=prep.truncated,
                          notes=prep.notes, total_tokens=prep.total_tokens, reuse=line,
                          routing=routing.spliced(old.routing if old is not None else None, t.routing, p))
        _kept = _Kept(weakref.ref(model.module), key, ids, cache, full_hidden, r)
    return r


def _spliced(old: np.ndarray | None, new: torch.Tensor, p: int) -> torch.Tensor:
    """(L, H, N, N) float32: the kept maps' first p rows (their columns after p are 0: causal) over the new
    rows (L, H, N - p, N) from the forward."""
    new = new.float()
    if old is None:
        return new
    L, H, n_new, N = new.shape
    full = torch.zeros(L, H, N, N, dtype=torch.float32)
    full[:, :, :p, :p] = torch.from_numpy(old[:, :, :p, :p])
    full[:, :, p:] = new
    return full


def _spliced_store(old, new, p: int):
    """A lazy run's store: per layer the kept run's first p rows of q and lse before the new rows'; k is the
    forward's own (the cache's keys, every token's)."""
    if old is None:
        return new
    return LazyAttention([b.splice(a, p) if hasattr(b, "splice") else  # a recurrent layer's (core.mamba2.KeptMamba)
                          LazyLayer(torch.cat([a.q[:, :, :p], b.q], dim=2), b.k,
                                    torch.cat([a.lse[..., :p], b.lse], dim=-1), b.options)
                          for a, b in zip(old.layers, new.layers)])
