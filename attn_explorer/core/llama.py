"""Llama (and SmolLM2, which is one): a causal decoder built from our parts.

Pre-norm blocks with RMSNorm, rotary positions (RoPE) on q and k, grouped-query attention (fewer
key/value heads than query heads), a SwiGLU MLP, a final RMSNorm and a language-model head that may
share the token embedding's matrix ("tied embeddings").

Gemma 2 and 3 are the same decoder with a few more switches (LlamaConfig's Gemma group, plus norm
"rms1p", act "gelu_tanh", qk_norm and sliding_windows): (1 + w) RMSNorms, a norm after each branch
too (sandwich), embeddings times sqrt(width), a GeGLU MLP, their own attention scale, soft-capped
logits (Gemma 2), q/k norms (Gemma 3), and local layers that see only their window of tokens
(with their own RoPE base in Gemma 3) between global ones.

SmolLM3, Granite and OLMo 2 / 3 are switches too: layers without RoPE (nope_layers), Granite's
multipliers (embeddings, each residual branch, the attention scale, the logits' divisor), and OLMo's
norms only after each branch (pre_norms=False) with q/k normalised over all heads' width.

For generation the forward takes a `KVCache`: the new tokens' keys and values are appended to the
cached ones, so each step runs one token through the stack and attends to everything before it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.attention import AttentionOptions, KVCache, decoder_start, key_padding_mask
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
from attn_explorer.core.layers import make_norm
from attn_explorer.core.linear import Linear
from attn_explorer.core.mla import LatentKV, MLAConfig
from attn_explorer.core.moe import MoEConfig
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.positional import PLAIN_ROPE, RopeScaling, rope_tables
from attn_explorer.core.hooks import Hooks


@dataclass
class LlamaConfig:
    vocab_size: int = 49152
    dim: int = 576  # hidden_size
    num_layers: int = 30  # num_hidden_layers
    num_heads: int = 9  # num_attention_heads (query heads)
    num_kv_heads: int = 3  # num_key_value_heads: query head h reads key/value head h // (H / H_kv)
    mlp_hidden: int = 1536  # intermediate_size
    max_positions: int = 8192  # max_position_embeddings
    eps: float = 1e-5  # rms_norm_eps
    rope_theta: float = 100000.0  # the base of RoPE's frequencies
    tie_embeddings: bool = True  # tie_word_embeddings: the LM head is the token embedding
    head: bool = True  # False: saved untied without its LM head (a bare LlamaModel): attention, no generation
    attention_bias: bool = False  # biases on q, k, v and W_O
    mlp_bias: bool = False
    # The families beyond Llama, each a readable switch (defaults: Llama):
    head_size: int | None = None  # head_dim in config.json where it is not dim / num_heads (Qwen3)
    qkv_bias: bool = False  # biases on q, k, v only, none on W_O (Qwen2)
    qk_norm: bool = False  # each head's q and k normalised over d_k (the model's norm) before RoPE (Qwen3)
    sliding_windows: list | None = None  # per layer: its window (a query sees itself and the window - 1
    #                                      tokens before it; Mistral, Qwen2's upper layers) or None (all)
    rotary_fraction: float = 1.0  # the share of each head's d_k that RoPE rotates (GPT-NeoX's rotary_pct)
    parallel_residual: bool = False  # x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX's use_parallel_residual)
    norm: str = "rms"  # "rms" (RMSNorm) or "layer" (LayerNorm with a bias; GPT-NeoX)
    mlp: str = "swiglu"  # "swiglu" (gate, up, down) or "mlp" (fc1, act, fc2 with biases; GPT-NeoX)
    act: str = "silu"  # the MLP's activation
    qkv_layout: str = "separate"  # "separate" (q, k, v projections), or one fused qkv: "stacked" (every q row,
    #                               then k's, then v's: Phi-3) or "per_head" (each head's q, k, v: GPT-NeoX)
    fused_gate_up: bool = False  # the SwiGLU's gate and up as one projection, gate rows first (Phi-3)
    # Gemma 2 / 3 (norm "rms1p" = (1 + w) RMSNorm, act "gelu_tanh"; local layers = those with a window):
    sandwich_norms: bool = False  # post_attention_norm and post_mlp_norm: each branch normalised before the sum
    scale_embeddings: bool = False  # token embeddings times sqrt(dim)
    attn_scale: float | None = None  # the attention logits' factor (query_pre_attn_scalar^-1/2); None: 1/sqrt(d_k)
    attn_softcap: float | None = None  # attention logits -> c·tanh(logits / c) (Gemma 2's attn_logit_softcapping)
    final_softcap: float | None = None  # next-token logits -> c·tanh(logits / c) (final_logit_softcapping)
    rope_local_theta: float | None = None  # RoPE base of the windowed layers (rope_local_base_freq); None: rope_theta
    # RoPE's frequency scaling (transformers' rope type and its numbers): of every layer, or, where
    # rope_local_theta is set (Gemma 3), of the global layers, the local ones taking rope_local_scaling
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    rope_local_scaling: RopeScaling = field(default_factory=RopeScaling)
    # SmolLM3, Granite, OLMo 2 / 3:
    nope_layers: list | None = None  # per layer, True: no RoPE there, no positions at all (SmolLM3's NoPE layers)
    embed_multiplier: float = 1.0  # token embeddings times this (Granite's embedding_multiplier)
    residual_multiplier: float = 1.0  # each branch times this before the residual sum (Granite)
    logits_divisor: float = 1.0  # next-token logits divided by this (Granite's logits_scaling)
    pre_norms: bool = True  # False: only the norms after each branch (OLMo 2's post_attention/feedforward norms)
    qk_norm_full: bool = False  # q_norm / k_norm over all heads' width before the head split (OLMo 2)
    rope_layout: str = "half"  # RoPE's pairs: "half" (rotate_half), "pairs" (interleaved: GLM-4, Cohere), "pairs_in"
    rope_linear_factor: float = 1.0  # mirrors a linear rope_scaling's factor (and reads checkpoints saved before it)
    # gpt-oss:
    attn_sinks: bool = False  # each head's learned sink logit joins its softmax (core.sinks): rows sum to 1 - sink
    # MoE (Qwen3-MoE, gpt-oss, Llama 4, DeepSeek-V3): the MLP of the MoE layers is routed experts (core.moe)
    moe: MoEConfig | None = None  # the MoE layers' experts and router; None: every layer has the dense MLP
    moe_layers: list | None = None  # per layer, True: MoE, False: the dense MLP (mlp_hidden); None: all MoE
    # Cohere / Cohere 2 (norm "layer_nobias"; GLM-4 needs no field of its own: sandwich norms, pairs RoPE):
    parallel_one_norm: bool = False  # with parallel_residual: both branches read one input norm (no norm2)
    logit_scale: float = 1.0  # next-token logits times this (Cohere's logit_scale)
    rope_float32: bool = False  # q and k turned in float32 in a bfloat16 / float16 model (Cohere), then cast back
    qk_norm_per_head: bool = False  # use_qk_norm (Command R+): q, k LayerNormed per head, a weight for each head
    # Llama 4 (NoPE layers: nope_layers; rope_layout "pairs"; MoE: moe, moe_layers):
    attention_chunk: int | None = None  # attention_chunk_size: a chunked layer's query sees only its own chunk
    chunked_layers: list | None = None  # per layer, True: chunked (Llama 4's RoPE layers)
    qk_rms_after_rope: bool = False  # use_qk_norm: q, k over their RMS (no weight) after RoPE, RoPE layers only
    temperature_tuning: tuple | None = None  # (floor_scale, attn_scale): the NoPE layers' queries times
    #                                          log(floor((position + 1) / floor_scale) + 1) · attn_scale + 1

    # DeepSeek-V3:
    mla: MLAConfig | None = None  # multi-head latent attention on every layer (core.mla); RoPE turns its
    #                               qk_rope_head_dim dimensions, and attn_scale is its softmax scale

    def __post_init__(self):
        if isinstance(self.mla, dict):  # a checkpoint's stored config gives plain objects
            self.mla = MLAConfig(**self.mla)
        if isinstance(self.moe, dict):
            self.moe = MoEConfig(**self.moe)
        for name in ("rope_scaling", "rope_local_scaling"):  # a checkpoint's stored config gives plain objects
            if isinstance(getattr(self, name), dict):
                setattr(self, name, RopeScaling(**getattr(self, name)))
        if self.rope_scaling.kind == "linear":
            self.rope_linear_factor = self.rope_scaling.factor
        elif self.rope_linear_factor != 1.0 and self.rope_scaling == PLAIN_ROPE:
            self.rope_scaling = RopeScaling("linear", factor=self.rope_linear_factor)

    @property
    def usable_positions(self) -> int:
        return self.max_positions

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.num_heads

    @property
    def rotary_dim(self) -> int:
        """How many of each head's dimensions RoPE rotates (the first ones): all but in GPT-NeoX; MLA: its
        rope part."""
        if self.mla is not None:
            return self.mla.qk_rope_head_dim
        return int(self.head_dim * self.rotary_fraction)

    def block(self, layer: int) -> BlockConfig:
        """What block `layer` is built from (the same for every layer today; a per-layer field goes here)."""
        return BlockConfig(
            self.dim, self.num_heads, self.mlp_hidden, norm_first=True, eps=self.eps, norm=self.norm, mlp=self.mlp,
            act=self.act, mlp_act=self.act, qkv_bias=self.attention_bias or self.qkv_bias,
            attn_out_bias=self.attention_bias, mlp_bias=self.mlp_bias, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_size, qk_norm=self.qk_norm, parallel=self.parallel_residual,
            fused_qkv=self.qkv_layout != "separate",
            qkv_layout="stacked" if self.qkv_layout == "separate" else self.qkv_layout,
            fused_gate_up=self.fused_gate_up, sandwich=self.sandwich_norms, pre_norms=self.pre_norms,
            qk_norm_full=self.qk_norm_full, residual_scale=self.residual_multiplier,
            mla=self.mla, rope_layout=self.rope_layout, sinks=self.attn_sinks, moe=self.moe if self.is_moe(layer) else None,
            one_norm=self.parallel_one_norm, rope_float32=self.rope_float32,
            qk_norm_per_head=self.qk_norm_per_head,
            qk_rms_after_rope=self.qk_rms_after_rope and not (self.nope_layers or [False] * (layer + 1))[layer],
        )

    def is_moe(self, layer: int) -> bool:
        """Whether layer's MLP is routed experts (moe, and moe_layers marks it or is None)."""
        return self.moe is not None and (self.moe_layers is None or bool(self.moe_layers[layer]))

    def layer_kinds(self) -> list[str]:
        """Per layer, for people: "local, window 512" (a sliding window) or "global", with ", no positions"
        on a layer without RoPE (SmolLM3's NoPE layers)."""
        windows = self.sliding_windows or [None] * self.num_layers
        nope = self.nope_layers or [False] * self.num_layers
        chunks = [self.attention_chunk if c else None for c in self.chunked_layers or [False] * self.num_layers]
        return [(f"local, window {w}" if w else f"local, chunk {c}" if c else "global") + (", no positions" if n else "")
                for w, n, c in zip(windows, nope, chunks)]


class Llama(nn.Module):
    causal = True

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = BlockStack(
            [
TransformerBlock(cfg.block(i), i) for i in range(cfg.num_layers)
            ]
        )
        self.norm = make_norm(cfg.norm, cfg.dim, cfg.eps)
        # Tied: no matrix of its own; `logits` multiplies by the embedding. Untied without a head: none.
        untied_head = not cfg.tie_embeddings and cfg.head
        self.lm_head = Linear(cfg.dim, cfg.vocab_size, bias=False) if untied_head else None
        # per kind (False: global, True: local) the (variant, cos, sin) last made; see `rope`
        self._rope_cache: dict[bool, tuple] = {}

    def rope(self, start: int, n: int, device, dtype, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's (cos, sin) for positions start..start+n-1 of a forward over start+n positions, each
        (n, rotary_dim). The table is computed once for the longest length seen and sliced after, and
        again when the scaling's frequencies change with the length (LongRoPE past its original length,
        dynamic NTK past max_position_embeddings). local=True: the windowed layers' table (base
        rope_local_theta and rope_local_scaling; Gemma 3)."""
        end = start + n
        cfg = self.cfg
        theta, scaling = (cfg.rope_local_theta, cfg.rope_local_scaling) if local else (cfg.rope_theta, cfg.rope_scaling)
        variant = scaling.variant(end)
        old = self._rope_cache.get(local)
        t = None if old is None or old[0] != variant else old[1:]
        # a table made under inference_mode cannot be saved for backward: autograd gets it made again
        stale = t is not None and t[0].is_inference() and not torch.is_inference_mode_enabled()
        if t is None or stale or t[0].shape[0] < end or t[0].device != device or t[0].dtype != dtype:
            size = max(end, 64 if t is None else 2 * t[0].shape[0])
            t = rope_tables(size, cfg.rotary_dim, theta, device=device, dtype=dtype, scaling=scaling, seq_len=end)
            self._rope_cache[local] = (variant, *t)
        return t[0][start:end], t[1][start:end]

    def new_cache(self) -> KVCache:
        cache = KVCache(self.cfg.num_layers)
        if self.cfg.mla is not None:  # DeepSeek-V3: each layer caches its latent, as transformers does
            cache.layers = [LatentKV() for _ in range(self.cfg.num_layers)]
        return cache

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        dk_scale: float = 1.0,
        dk_layers=None,
        output_attentions: bool = False,
        hooks: Hooks | None = None,
        cache: KVCache | None = None,
        embeds: torch.Tensor | None = None,
        attend: torch.Tensor | None = None,
        rope: tuple | None = None,  # Qwen2.5-VL: the M-RoPE (cos, sin) of these tokens, each (N, d_k)
        attend_local: torch.Tensor | None = None,  # Gemma 3 multimodal: the windowed layers' own mask (see below)
        **_,
    ) -> ModelOutput:
        """input_ids (B, N): the new tokens. With a cache they sit at positions past..past+N-1 and
        attend to the cached tokens too; attention_mask (B, past + N), 1 = a real token.
        Vision-language models (core.vlm): embeds (B, N, D) replaces `embed(input_ids)` (image vectors at
        the placeholders); attend, bool (B, 1, N, past + N), replaces the causal mask (PaliGemma's prefix);
        attend_local, the same for the windowed layers, their window already in it (Gemma 3's image runs)."""
        N = input_ids.shape[1]
        past = decoder_start(cache, N, self.cfg.max_positions)
        x = self.embed(input_ids) if embeds is None else embeds
        cfg = self.cfg
        opts = AttentionOptions(mask=key_padding_mask(attention_mask), causal=True, dk_scale=dk_scale,
                                rope=self.rope(past, N, x.device, x.dtype) if rope is None else rope,
                                scale=cfg.attn_scale,
                                softcap=cfg.attn_softcap)
        if attend is not None:  # vision-language: the caller's mask instead of the causal one
            pad = opts.mask
            opts = replace(opts, causal=False, mask=attend if pad is None else attend & pad.bool())
        windows = cfg.sliding_windows
        layer_opts = [{"window": w} for w in windows] if windows and any(windows) else None
        if layer_opts and cfg.rope_local_theta is not None:  # Gemma 3: the local layers' own RoPE base
            local_rope = self.rope(past, N, x.device, x.dtype, local=True)
            layer_opts = [dict(o, rope=local_rope) if o["window"] else o for o in layer_opts]
        if attend_local is not None and layer_opts:  # Gemma 3 multimodal: the windowed layers' mask, window in it
            pad = key_padding_mask(attention_mask)
            local = attend_local if pad is None else attend_local & pad.bool()
            layer_opts = [dict(o, window=None, mask=local) if o["window"] else o for o in layer_opts]
        if cfg.nope_layers and any(cfg.nope_layers):  # SmolLM3: these layers see no positions
            layer_opts = layer_opts or [{} for _ in range(cfg.num_layers)]
            layer_opts = [dict(o, rope=None) if n else o for o, n in zip(layer_opts, cfg.nope_layers)]
        if cfg.chunked_layers or cfg.temperature_tuning:
            layer_opts = llama4_options(cfg, layer_opts, past, N, x.device, attention_mask)
        x, attn = self.blocks(x, opts, dk_layers=dk_layers, output_attentions=output_attentions,
                              hooks=hooks, cache=cache, layer_opts=layer_opts)
        return ModelOutput(hidden=self.norm(x), attentions=attn)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token vectors the first block reads: the embedding times the family's multipliers."""
        x = self.embed_tokens(input_ids)
        cfg = self.cfg
        if cfg.embed_multiplier != 1.0:  # Granite's embedding_multiplier
            x = x * cfg.embed_multiplier
        if cfg.scale_embeddings:  # sqrt(dim) rounded to the weights' dtype first, as transformers does
            x = x * torch.tensor(cfg.dim ** 0.5, dtype=x.dtype, device=x.device)
        return x

    @property
    def can_generate(self) -> bool:
        """Whether there is an LM head: its own, or the embedding (tied)."""
        return self.cfg.tie_embeddings or self.cfg.head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits (..., vocab) from the final hidden states."""
        if self.cfg.tie_embeddings:
            logits = F.linear(hidden, self.embed_tokens.weight)
        elif self.lm_head is None:
            raise RuntimeError("this Llama was loaded without its LM head: it has no next-token logits")
        else:
            logits = self.lm_head(hidden)
        if self.cfg.logits_divisor != 1.0:  # Granite's logits_scaling
            logits = logits / self.cfg.logits_divisor
        if self.cfg.logit_scale != 1.0:  # Cohere's logit_scale
            logits = logits * self.cfg.logit_scale
        c = self.cfg.final_softcap
        return logits if c is None else torch.tanh(logits / c) * c  # Gemma's final_logit_softcapping


def llama4_options(cfg: LlamaConfig, layer_opts: list[dict] | None, past: int, n: int, device,
                   attention_mask: torch.Tensor | None = None) -> list[dict]:
    """Llama 4's per-layer additions: the chunk on its chunked layers, and on its NoPE layers each new query's
    temperature, log1p(floor((p + 1) / floor_scale)) · attn_scale + 1 at position p, in float32 as transformers.
    A row with left padding counts its chunks from its first real token, as transformers does: its chunked
    layers then take one (B, 1, n, M) mask of their own."""
    layer_opts = layer_opts or [{} for _ in range(cfg.num_layers)]
    chunked = cfg.chunked_layers or [False] * cfg.num_layers
    nope = cfg.nope_layers or [False] * cfg.num_layers
    scale = None
    if cfg.temperature_tuning:
        floor_scale, attn_scale = cfg.temperature_tuning
        positions = torch.arange(past, past + n, device=device).float()
        scale = torch.log1p(torch.floor((positions + 1.0) / floor_scale)) * attn_scale + 1.0
    shifted = None if attention_mask is None else _left_padded_chunks(attention_mask, cfg.attention_chunk, past, n)
    out = []
    for o, c, p in zip(layer_opts, chunked, nope):
        if c and cfg.attention_chunk:
            o = dict(o, chunk=cfg.attention_chunk) if shifted is None else dict(o, mask=shifted)
        out.append(dict(o, query_scale=scale) if p and scale is not None else o)
    return out


def _left_padded_chunks(attention_mask: torch.Tensor, chunk: int | None, past: int, n: int) -> torch.Tensor | None:
    """bool (B, 1, n, M): causal, the same chunk counted from each row's first real token, real keys only;
    None where no row is left-padded (then AttentionOptions.chunk says it all)."""
    if not chunk:
        return None
    real = attention_mask.bool()
    lead = (real.long().cumsum(-1) == 0).sum(-1)  # each row's left padding
    if not bool(lead.any()):
        return None
    q = torch.arange(past, past + n, device=real.device)[None, :, None] - lead[:, None, None]
    k = torch.arange(real.shape[-1], device=real.device)[None, None, :] - lead[:, None, None]
    return ((k <= q) & (torch.div(k, chunk, rounding_mode="floor") == torch.div(q, chunk, rounding_mode="floor"))
            & real[:, None, :])[:, None]
