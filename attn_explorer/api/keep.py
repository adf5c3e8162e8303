"""What a run keeps, decided before it runs: the maps themselves, or each layer's q, k and row statistics (lazy,
api.lazy), and the memory guard that refuses, in one line, an input whose maps or stores would not fit.

`Model.run` asks `keep_lazily` (through Model._keep_lazily, which passes api.model.DENSE_MAX_BYTES as it stands
at call time); vision-language runs ask the same (api.vlm)."""
from __future__ import annotations

import torch

from attn_explorer.api.lazy import module_kept_bytes
from attn_explorer.budget import attention_maps_bytes, human_bytes
from attn_explorer.errors import UserError


def keep_lazily(model, prep, lazy: bool | None, hidden: bool, seq2seq: bool, dense_max: int, budget: int,
                kv_cache: bool = False) -> bool:
    """Whether this run keeps q, k and lse instead of the maps (see Model.run's `lazy`), after the memory guard
    for what it will really keep: the maps (dense), or every layer's q, k, lse and the hidden state; and with
    kv_cache (reuse_prefix on a decoder) the keys and values it keeps for the next run (a lazy run's keys are the
    cache's own: only the values add). dense_max: above it an automatic run (lazy None) keeps q and k; budget:
    the bytes that can be spared now (budget.default_budget, as api.model reads it)."""
    if lazy is not None and not isinstance(lazy, bool):
        raise UserError(f"lazy must be True, False or None (automatic), got {lazy!r}")
    i = model.info
    if seq2seq or i.encoder_decoder:
        if lazy:
            raise UserError("lazy attention (q and k kept instead of the maps) is not supported yet for "
                            "encoder-decoders (BART): use fewer tokens")
        check_memory(model, prep, budget)
        return False
    # lazy hybrids: Mamba-2 layers keep B, C, dt, A (core.mamba2), Gated DeltaNet q, k, g, β (core.deltanet)
    if any(k not in ("softmax", "mamba2", "deltanet") for k in i.mixers):  # a kind with no lazy store
        if lazy:
            raise UserError(f"{i.family}: lazy attention is not supported yet for its recurrent layers "
                            "(their maps are computed whole); pass lazy=False or use fewer tokens")
        check_memory(model, prep, budget)
        return False
    n = model.token_count(prep)
    dense = dense_bytes(model, n)
    H, H_kv, d = head_shape(model)
    kv_one = i.num_layers * H_kv * n * d * model.dtype.itemsize if kv_cache else 0  # the cache's k (or v)
    if lazy is False or (lazy is None and dense + 2 * kv_one <= min(budget, dense_max)):
        check_memory(model, prep, budget, 2 * kv_one)
        return False
    need = module_kept_bytes(model.module, n, i.num_layers, H, H_kv, d, model.dtype.itemsize) + (
        n * i.hidden_size * 4 if hidden else 0)
    if need + kv_one > budget:
        cache = f" and {human_bytes(kv_one)} of values for the KV cache a reused prefix keeps" if kv_one else ""
        raise UserError(f"{n:,} tokens would keep {human_bytes(need)} of queries and keys{cache} for "
                        f"{i.num_layers} layers × {H} heads (the maps themselves: {human_bytes(dense)}); only "
                        f"{human_bytes(budget)} can be spared now: use fewer tokens or a smaller image size")
    return True


def dense_bytes(model, n: int) -> int:
    """What the maps of n tokens take while a run makes them (see check_memory)."""
    elem = model.dtype.itemsize + (0 if model.dtype == torch.float32 else 4)
    return attention_maps_bytes(n, model.info.num_layers, model.info.num_heads, elem=elem)


def head_shape(model) -> tuple[int, int, int]:
    """(query heads, key/value heads, head size) of the module's attention layers."""
    layers = getattr(getattr(model.module, "blocks", None), "layers", None) or []
    # hybrids (core.recurrent): the first softmax layer's (a recurrent mixer has no key/value heads)
    attn = next((b.attn for b in layers if hasattr(getattr(b, "attn", None), "num_kv_heads")), None)
    if attn is None:
        i = model.info
        return i.num_heads, i.num_heads, i.hidden_size // max(1, i.num_heads)
    return attn.num_heads, attn.num_kv_heads, attn.head_dim


def check_memory(model, prep, budget: int, cache_bytes: int = 0) -> None:
    """Refuse, before running, an input whose attention maps would not fit in memory: budget, the same the Cost
    page uses (half of the free memory on the CPU, 80 % on a GPU). The module holds the maps in its own dtype,
    and a RunResult's are float32: a float16 or bfloat16 model holds both at once while the copy is made, 2 + 4
    bytes an element; a float32 model shares one buffer, 4. cache_bytes: the keys and values a decoder's run
    keeps for the next one (reuse_prefix), beside the maps."""
    n = model.token_count(prep)
    i = model.info
    maps = dense_bytes(model, n)
    if maps + cache_bytes > budget:
        cache = f" and {human_bytes(cache_bytes)} for the KV cache a reused prefix keeps" if cache_bytes else ""
        raise UserError(f"{n:,} tokens would need {human_bytes(maps + cache_bytes)}: {human_bytes(maps)} for the "
                        f"attention maps of {i.num_layers} layers × {i.num_heads} heads{cache}; only "
                        f"{human_bytes(budget)} can be spared now: use fewer tokens or a smaller image size")
