"""Plain-data records that leave the model layer: what a model is, and what one run returned.

Only NumPy arrays and plain Python values live here, so these records can cross into the GUI thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ModelInfo:
    name: str  # what the user asked for: "minilm", a folder, a hub id
    family: str  # "bert", "roberta", "gpt2", "vit", "deit", "dinov2", "textbook"
    modality: str  # "text", "image" or "image-text" (vision-language: api.vlm.VisionLanguageModel, run(image, text=...))
    num_layers: int  # L
    num_heads: int  # H
    hidden_size: int  # D
    max_positions: int  # the longest token sequence the model can take (text); patches at default size (image)
    device: str  # "cpu", "cuda", "mps"
    dtype: str  # "float32", "bfloat16", "float16"
    trained: bool  # False for random weights: the GUI must say "untrained"
    causal: bool = False  # decoder (GPT-2): no weight above the diagonal
    can_generate: bool = False  # a decoder with an LM head (its own or the tied embedding): Model.generate works
    note: str = ""  # honest one-line remark shown in the GUI ("backbone fine-tuned for saliency", ...)
    patch_size: int | None = None  # image models
    image_size: int | None = None  # image models: default input side in pixels
    num_params: int = 0
    min_tokens: int = 1  # the shortest input with one real token: [CLS] w [SEP] is 3 for BERT, 1 for GPT-2
    encoder_decoder: bool = False  # BART: num_layers/num_heads are the encoder's; a run also has the decoder's maps
    decoder_layers: int = 0  # encoder-decoders: the decoder's L
    decoder_heads: int = 0  # encoder-decoders: the decoder's H (self- and cross-attention)
    # per layer "local, window 512" (sees only its last 512 tokens) or "global", for models that mix them
    # (Gemma 2/3, Mistral); empty when every layer sees every token before it
    layer_kinds: tuple[str, ...] = ()
    # what the weights are, in words, for the model picker: "trained" or "untrained" where that is known (the
    # built-ins, our own checkpoints), else where they came from ("from tiny-bert"): a folder or hub id may
    # hold random weights and nothing in it says so, so it is never called "trained"
    weights: str = ""
    # MoE models (Qwen3-MoE, gpt-oss, Llama 4, DeepSeek-V3): per layer, True where its MLP is routed experts
    # (blocks.{i}.mlp.hook_expert_* exist there); () for a dense model
    moe_layers: tuple[bool, ...] = ()
    num_experts: int = 0  # experts of each MoE layer
    experts_per_token: int = 0  # k: experts each token is sent to
    # Hybrids (core.recurrent: Qwen3.5 / Qwen3-Next, Granite 4 hybrid, Falcon-H1): per layer its mixer, "softmax",
    # "deltanet" or "mamba2" (() when every layer is softmax attention), and per layer how many heads its maps
    # have (() when all have num_heads). num_heads is then the largest; RunResult.attentions (L, H, N, N) holds
    # zeros in heads layer_heads[l]..H-1 of a layer with fewer (no such head: not to be shown or ablated).
    # Recurrent layers' maps are signed implicit attention (rows need not sum to 1), not probabilities.
    mixers: tuple[str, ...] = ()
    layer_heads: tuple[int, ...] = ()


@dataclass(frozen=True)
class Routing:
    """An MoE model's routing in one run (RunResult.routing): per layer, each token's k chosen experts and their
    weights (what multiplies each expert's output; Llama 4: its input), as the hooks
    blocks.{i}.mlp.hook_expert_indices / hook_expert_weights saw them. Dense layers (Qwen3-MoE's mlp_only_layers,
    DeepSeek-V3's first dense layers) have None."""

    num_experts: int
    experts: tuple  # per layer: int64 (N, k), in the router's order (highest choice score first), or None
    weights: tuple  # per layer: float32 (N, k), or None

    @property
    def num_layers(self) -> int:
        return len(self.experts)

    @property
    def moe_layers(self) -> list[int]:
        """The layers that route (have experts)."""
        return [i for i, e in enumerate(self.experts) if e is not None]

    def top(self) -> tuple[np.ndarray, np.ndarray]:
        """(experts int64 (L, N), weights float32 (L, N)): each token's expert with the largest weight in each
        layer (the first chosen on a tie); -1 and NaN on dense layers."""
        n = next(e.shape[0] for e in self.experts if e is not None)
        top_e = np.full((self.num_layers, n), -1, dtype=np.int64)
        top_w = np.full((self.num_layers, n), np.nan, dtype=np.float32)
        for i in self.moe_layers:
            j = np.argmax(self.weights[i], axis=1)
            top_e[i] = np.take_along_axis(self.experts[i], j[:, None], 1)[:, 0]
            top_w[i] = np.take_along_axis(self.weights[i], j[:, None], 1)[:, 0]
        return top_e, top_w

    def arrays(self) -> dict[str, np.ndarray]:
        """What export writes: routing_experts int64 (L, N, k) (-1 on dense layers), routing_weights float32
        (L, N, k) (0 on dense layers) and routing_num_experts."""
        n, k = next(e.shape for e in self.experts if e is not None)
        ex = np.full((self.num_layers, n, k), -1, dtype=np.int64)
        w = np.zeros((self.num_layers, n, k), dtype=np.float32)
        for i in self.moe_layers:
            ex[i], w[i] = self.experts[i], self.weights[i]
        return {"routing_experts": ex, "routing_weights": w,
                "routing_num_experts": np.asarray(self.num_experts, dtype=np.int64)}

    @classmethod
    def from_arrays(cls, experts: np.ndarray, weights: np.ndarray, num_experts: int) -> "Routing":
        """`arrays()` read back: layers whose experts are all -1 are dense (None)."""
        dense = [bool((e == -1).all()) for e in experts]
        return cls(int(num_experts),
                   tuple(None if d else np.ascontiguousarray(e, dtype=np.int64) for e, d in zip(experts, dense)),
                   tuple(None if d else np.ascontiguousarray(w, dtype=np.float32) for w, d in zip(weights, dense)))


@dataclass
class RunResult:
    attentions: np.ndarray  # float32 (L, H, N, N); row i = where query token i looks (a lazy run: NotKept)
    tokens: list[str]  # length N; for images "[CLS]" then "r{row}c{col}" patch labels
    special: np.ndarray  # bool (N,): True for [CLS], [SEP], <s>, </s>, BOS and the like
    model: str  # ModelInfo.name
    dk_scale: float  # multiplier applied to 1/sqrt(d_k)
    forward_ms: float  # measured wall time of the forward pass
    # the model's first forward pass: its time includes one-off start-up costs (kernels chosen, caches
    # filled), often 10-20x a later run's, so it says little about the cost of attention
    warm_up: bool = False
    grid: tuple[int, int] | None = None  # image models: patch grid (rows, cols)
    image: np.ndarray | None = None  # image models: uint8 (H, W, 3), the exact pixels the model saw (after resize/crop)
    truncated: bool = False  # the input was longer than allowed and was cut
    notes: list[str] = field(default_factory=list)  # one-line remarks for the user ("truncated to 512 tokens")
    top5: list[tuple[str, float]] | None = None  # classifier checkpoints: (label, probability)
    hidden: np.ndarray | None = None  # float32 (N, D) last hidden state, when asked for
    total_tokens: int = 0  # tokens the whole input has, before any cut (text); N for images
    patch_offset: int = 0  # image models: patch tokens are tokens[patch_offset:], row by row
    display: Any = None  # the grid view's mosaic (api.display.GridImage), pooled by the session's worker with the run
    # encoder-decoders (BART): `attentions`, `tokens` and `hidden` are the encoder's (the source text);
    # the decoder reads decoder_tokens (the target shifted right: the start token first)
    decoder_tokens: list[str] = field(default_factory=list)  # length T
    decoder_special: np.ndarray | None = None  # bool (T,)
    decoder_attentions: np.ndarray | None = None  # float32 (L_dec, H, T, T), causal: row t = where target token t looks
    cross_attentions: np.ndarray | None = None  # float32 (L_dec, H, T, S): row t = which source tokens target token t reads
    decoder_hidden: np.ndarray | None = None  # float32 (T, D) the decoder's last hidden state, when asked for
    # long inputs: the store that computes any part of any head's map exactly from each layer's q, k and row
    # statistics (api.lazy), instead of every map; None when `attentions` holds the maps themselves.
    # Its methods run torch: call them (through `attention`) in worker threads only, never in the GUI thread.
    lazy: Any = None
    # Model.run(reuse_prefix=True): what was reused of the last run, in words for the status bar ("reused 8,190
    # of 8,192 tokens"; for an encoder, why nothing can be), any reason in brackets at the end; "" when not asked
    reuse: str = ""
    # gpt-oss (learned attention sinks): float32 (L, H, N), each query row's share given to its head's sink; the
    # rows of `attentions` sum to 1 - this (api.sinks). None for a model without sinks
    sinks: np.ndarray | None = None
    # MoE models: which experts each token went to in every layer (Routing); None for a dense model
    routing: Routing | None = None
    # vision-language models (core.vlm, api.vlm): `attentions` is the decoder's over every token, image and text;
    # the tower's own maps (T tiles, L_v layers, H_v heads, P tower tokens), and per image token (int32 rows)
    # its position in `tokens`, its tile (-1: none), its row and column in that tile's grid of image tokens
    # (-1 for a tower's class token) and its merge (the side of the square of patches it stands for)
    vision_attentions: np.ndarray | None = None  # float32 (T, L_v, H_v, P, P)
    image_token_positions: np.ndarray | None = None  # int32 (n_image_tokens, 5): token, tile, row, col, merge
    # Idefics3 / SmolVLM: (tile rows, tile cols) the picture was cut into; tile t < rows*cols is row t // cols,
    # column t % cols, and tile rows*cols is the global view (the whole picture); None: one view, tile 0
    image_tiles: tuple[int, int] | None = None

    @property
    def is_lazy(self) -> bool:
        """The maps were not kept: read them with `attention(layer, head, rows, cols, pool)`."""
        return self.lazy is not None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def attention(self, layer: int, head: int, rows=None, cols=None, pool=None, reduce: str = "max",
                  **lazy_kw) -> np.ndarray:
        """One head's map, or the part of it a view draws, as float32 NumPy.

        rows / cols: None (all), an int (one query's row / one key's column: the result loses that axis),
        a slice, or (start, stop). pool: None (full resolution), an int or (rows, cols): the window is
        reduced to at most that many cells, each the max (reduce="max") or the mean ("mean") of the exact
        probabilities it covers (maths.pool_edges' blocks).

        A lazy result (is_lazy) computes the answer from its store (api.lazy.LazyAttention.attention; runs
        torch: worker threads only), where lazy_kw may pass progress(done, total) and stop()."""
        if self.is_lazy:
            return self.lazy.attention(layer, head, rows, cols, pool, reduce, **lazy_kw)
        from attn_explorer.maths import pool2d

        from attn_explorer.validate import existing_head

        L, H = self.attentions.shape[:2]
        existing_head(layer, head, L, H, "the run")
        r, c = _index(rows), _index(cols)
        a = self.attentions[int(layer), int(head)][r][:, c] if not isinstance(r, int) else \
            self.attentions[int(layer), int(head)][r][c]
        if pool is None or a.ndim < 2:
            return np.ascontiguousarray(a, dtype=np.float32)
        pr, pc = (pool, pool) if np.isscalar(pool) else pool
        return np.ascontiguousarray(pool2d(a, int(pr), int(pc), reduce), dtype=np.float32)

    def to_bertviz(self):
        """(attention, tokens) as bertviz's `head_view` and `model_view` take them: a tuple of L torch
        tensors shaped (1, H, N, N), one per layer, and the N tokens (torch is imported here, on first use).

        >>> from bertviz import head_view
        >>> attention, tokens = model.run("The animal didn't cross the street.").to_bertviz()
        >>> head_view(attention, tokens)
        """
        import torch

        att = torch.from_numpy(np.array(self.attentions, dtype=np.float32))  # (L, H, N, N), a copy
        return tuple(att[i].unsqueeze(0) for i in range(att.shape[0])), list(self.tokens)


class NotKept:
    """`RunResult.attentions` of a lazy run: the maps were not kept. It has the maps' shape (so code that
    only reads `.shape` or `.ndim` keeps working) and refuses, in one line, anything that reads values."""

    ndim = 4
    dtype = np.dtype(np.float32)

    def __init__(self, shape: tuple[int, int, int, int], dense_bytes: int = 0):
        self.shape = tuple(int(s) for s in shape)
        self.dense_bytes = int(dense_bytes)

    def __len__(self) -> int:
        return self.shape[0]

    def _refuse(self, *_args, **_kw):
        from attn_explorer.budget import human_bytes
        from attn_explorer.errors import UserError

        L, H, N, _ = self.shape
        need = f" (they would need {human_bytes(self.dense_bytes)})" if self.dense_bytes else ""
        raise UserError(f"this {N:,}-token run kept no attention maps{need}: read a head with "
                        f"r.attention(layer, head, rows=..., cols=..., pool=...)")

    __array__ = __getitem__ = __iter__ = __contains__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __float__ = __bool__ = _refuse
    __hash__ = None

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle and numpy probe for these: not found, not refused
            raise AttributeError(name)
        self._refuse()

    def __repr__(self) -> str:
        return f"NotKept(shape={self.shape})"


def _index(x):
    """rows/cols of RunResult.attention -> an int or a slice."""
    if x is None:
        return slice(None)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, slice):
        return x
    start, stop = x
    return slice(int(start), int(stop))
