"""`Model`: one of our modules plus what turns text or a picture into its input, and `run`."""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import torch

from attn_explorer.budget import default_budget
from attn_explorer.errors import UserError
from attn_explorer.hub.images import ImagePreprocess, open_image
from attn_explorer.api import prefix, routing, sinks
from attn_explorer.api.keep import head_shape, keep_lazily
from attn_explorer.api.hooks import (ActivationCache, Trace, ablation_hooks, caching_hook, check_names, merge,
                                     model_hook_names, select_names)
from attn_explorer.api.lazy import LazyAttention
from attn_explorer.api.result import ModelInfo, NotKept, RunResult
from attn_explorer.core import heap
from attn_explorer.core.hooks import HookError, Hooks
from attn_explorer.hub.text import TextTokenizer
from attn_explorer.validate import (dk_scale_value, finite_attention, positive_int, text_size_ok,
                                    visible_text)


# Model.run(lazy=None) keeps q and k instead of maps that would take more than this: above it the maps cost
# more memory than they are worth (SmolLM2 ~1,400 tokens, Gemma 3 270M ~2,700, DINOv2-S at 1036 px), and the
# lazy forward is no slower than the plain one (benchmarks/bench_long.py)
DENSE_MAX_BYTES = 2 * 10**9


@dataclass
class Prepared:
    """One input made ready for the module: its forward's keyword arguments, and what a run reports about it."""

    inputs: dict  # keyword arguments of the module's forward (input_ids, pixels, x...)
    tokens: list[str] | None = None  # text: the tokens kept
    special: list[bool] | None = None  # text: which of them are special ([CLS], [SEP]...)
    total_tokens: int = 0  # text: tokens of the whole input, before any cut
    truncated: bool = False  # text: tokens were cut
    notes: list[str] = field(default_factory=list)  # one-line remarks for the user
    image: np.ndarray | None = None  # image: uint8 (H, W, 3), the pixels the model sees


class Model:
    """A loaded model. `run(text)` or `run(image)` returns a RunResult with every layer's attention."""

    def __init__(
        self,
        module: torch.nn.Module,
        info: ModelInfo,
        tokenizer: TextTokenizer | None = None,
        preprocess: ImagePreprocess | None = None,
        labels: dict[int, str] | None = None,
        encode: Callable | None = None,
    ):
        self.module = module.eval()
        self.info = info
        self.tokenizer = tokenizer
        self.preprocess = preprocess
        self.labels = labels or {}
        self._encode = encode  # the textbook model embeds words itself
        self._warm = False  # a forward pass has run: later times no longer include one-off start-up costs
        self._context_hooks: tuple[dict, ...] = ()  # the hook tables of the `with m.hooks(...)` blocks now open

    @property
    def device(self) -> torch.device:
        """Where inputs go: the module's device, or for a model accelerate spread over devices and disk,
        its main device (its hooks move each block's weights and inputs)."""
        main = getattr(self.module, "main_device", None)
        return main if main is not None else next(self.module.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    def __repr__(self) -> str:
        i = self.info
        return f"Model({i.name!r}, {i.family}, L={i.num_layers}, H={i.num_heads}, D={i.hidden_size}, {i.device})"

    def run(self, x, dk_scale: float = 1.0, dk_layers=None, max_tokens: int | None = None,
            image_size: int | None = None, hidden: bool = False, target: str | None = None,
            ablate: dict | None = None, reuse_prefix: bool = False, lazy: bool | None = None) -> RunResult:
        """Attention of every head in every layer for x (text for text models; a PIL image or a
        file path for image models). max_tokens keeps exactly the first max_tokens tokens, special
        tokens included (at least info.min_tokens); image_size sets the square input side in pixels
        (rounded down to whole patches). target: the decoder's text for an encoder-decoder (BART): the
        result also has decoder_attentions and cross_attentions (see api.seq2seq).
        ablate: {(layer, head): "zero" | "mean"} switches those heads off before W_O (a hook on
        blocks.{layer}.attn.hook_z: api.hooks.ablation_hooks); later layers' maps and the hidden state show it.
        reuse_prefix: a decoder keeps this run's KV cache, and the next run with it on runs only the tokens
        from the first one that changed (api.prefix); `RunResult.reuse` says what was reused.
        lazy: keep each layer's q, k and row statistics instead of the maps (api.lazy: `RunResult.attention`
        computes any part of any head exactly; `attentions` refuses). None (default): lazy where the maps
        would take more than DENSE_MAX_BYTES or not fit the memory budget; False: the maps themselves (refused
        in one line where they do not fit); True: lazy at any size. Encoder-decoders stay dense.
        Hooks set with `with m.hooks({...}):` apply here too (see run_with_hooks)."""
        return self._run(x, {}, None, dict(dk_scale=dk_scale, dk_layers=dk_layers, max_tokens=max_tokens,
                                           image_size=image_size, hidden=hidden, target=target, ablate=ablate,
                                           reuse_prefix=reuse_prefix, lazy=lazy))

    # ---- hook points (core.hooks: the names, shapes and order) --------------------------------------------

    def hook_names(self) -> list[str]:
        """Every named activation of this model, in the order a forward pass reaches it: hook_embed;
        per block blocks.{i}.hook_resid_pre, .attn.hook_q, .attn.hook_k, .attn.hook_v (after QK-norm and RoPE,
        before grouped-query repetition; (B, N, heads, d_head)), .attn.hook_pattern (B, H, N, M), .attn.hook_z
        (heads' outputs before W_O, (B, N, H, d_head)), .hook_attn_out, (MoE layers: .mlp.hook_expert_indices and
        .mlp.hook_expert_weights, (B, N, k)), .hook_mlp_out, .hook_resid_post; hook_final (after the final norm);
        hook_logits for decoders with an LM head."""
        return model_hook_names(self.info)

    def run_with_hooks(self, x, hooks: Mapping[str, Callable], **run_kw) -> RunResult:
        """`run(x, **run_kw)` with hooks {name: fn} (or {name: [fns]}): fn(tensor, name) may return a tensor
        of the same shape that replaces the activation for everything after it, or None.

        >>> def zero_head_2(z, name):      # z: (B, N, H, d_head)
        ...     z[:, :, 2] = 0
        >>> m.run_with_hooks(text, hooks={"blocks.3.attn.hook_z": zero_head_2})
        """
        check_names(hooks, self.hook_names())
        return self._run(x, hooks, None, run_kw)

    def run_with_cache(self, x, names=None, **run_kw) -> tuple[RunResult, ActivationCache]:
        """(result, cache): `run(x, **run_kw)` keeping the activations named by `names` (None: every hook
        point; a list; or a callable name -> bool), detached, in the model's dtype and on its device.
        A lazy run (long inputs) keeps no maps: asking it for hook_pattern is refused in one line (read
        r.attention(...) instead), and names=None leaves hook_pattern out."""
        valid = self.hook_names()
        chosen = select_names(names, valid)
        store: dict = {}
        r = self._run(x, {}, (chosen, store, names is None), run_kw)
        return r, ActivationCache({n: store[n] for n in chosen if n in store}, valid)

    @contextmanager
    def hooks(self, hooks: Mapping[str, Callable]):
        """Hooks {name: fn} on every run (run, run_with_cache, run_with_hooks, trace) inside the block:

        >>> with m.hooks({"blocks.0.attn.hook_z": fn}):
        ...     a, b = m.run(text_a), m.run(text_b)
        """
        check_names(hooks, self.hook_names())
        table = merge(hooks)
        self._context_hooks = self._context_hooks + (table,)  # a new tuple: a run in another thread sees old or new
        try:
            yield self
        finally:
            self._context_hooks = tuple(t for t in self._context_hooks if t is not table)

    def active_hooks(self) -> dict:
        """The hooks of the `with m.hooks(...)` blocks open now, as one {name: (fns...)} table."""
        return merge(*self._context_hooks)

    def trace(self, inputs, hooks: Mapping[str, Callable] | None = None, names=(), *, dk_scale: float = 1.0,
              dk_layers=None, attentions: bool = False, grad: bool = False, lazy: bool = False,
              ablate: dict | None = None) -> Trace:
        """One forward pass of prepared inputs (`prepare(x)`, or its `.inputs`: the module's keyword
        arguments, which may hold a batch of copies) with hooks {name: fn}, keeping the activations named
        by `names` (a list, None for all, or a callable). What analyses build on: no RunResult, no memory
        guard, tensors out. attentions: also the module's stacked maps (out.attentions, (B, L, H, N, M)).
        grad: run with autograd (the cache keeps tensors in the graph). lazy: keep each layer's q, k and lse
        (Trace.lazy) instead of any map. ablate: {(layer, head): "zero" | "mean"} as run's.
        The one forward every run goes through (run, run_with_cache, run_with_hooks, a vision-language run), so
        hooks meet one order: ablation, the open `with m.hooks()` blocks, `hooks`, then the caching of `names`."""
        inputs = inputs.inputs if isinstance(inputs, Prepared) else inputs
        dk_scale, dk_layers = self.check_dk(dk_scale, dk_layers)
        valid = self.hook_names()
        if hooks:
            check_names(hooks, valid)
        chosen = select_names(names, valid)
        store: dict = {}
        rt = routing.Recorder(self.info)  # MoE models: each token's experts, for result_of and api.prefix
        first = ablation_hooks(ablate, self.info) if ablate else None
        table = merge(first, *self._context_hooks, hooks, {n: caching_hook(store, detach=not grad) for n in chosen},
                      rt.table)
        out, ms, logits = self._forward(inputs, dk_scale, dk_layers, Hooks(table, keep=lazy),
                                        output_attentions=attentions, grad=grad)
        return Trace(out, ActivationCache(store, valid), ms, logits, getattr(out, "lazy", None), rt.result())

    def result_of(self, trace: Trace, prep: Prepared, dk_scale: float = 1.0) -> RunResult:
        """The RunResult a run of `prep` gives, from a trace of it that kept the maps (attentions=True)."""
        if trace.out.attentions is None and trace.lazy is None:
            raise UserError("this trace kept no maps: trace(..., attentions=True)")
        if self.info.modality == "text":
            return self._result(trace.out, trace.ms, prep.tokens, prep.special, dk_scale, False,
                                truncated=prep.truncated, notes=prep.notes, total_tokens=prep.total_tokens,
                                routing=trace.routing)
        return self._image_result(trace.out, trace.ms, prep, dk_scale, False)

    def W_O(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s output projection per head, (H, d_head, D) (TransformerLens's W_O[layer]): head h
        writes z[..., h, :] @ W_O[h] into the stream (b_O is added once, after the heads). Detached, to multiply
        with cached activations; for gradients read module.blocks.layers[layer].attn.out.weight itself."""
        attn = self.module.blocks.layers[layer].attn
        return attn.out.weight.detach().T.reshape(attn.num_heads, attn.head_dim, -1)

    def _run(self, x, hooks: Mapping, cache: tuple | None, kw: dict) -> RunResult:
        """run's body with hook tables: `hooks` {name: fn}; cache (names, store, every): what to keep."""
        from attn_explorer.api.seq2seq import prepare_target, result_fields

        defaults = dict(dk_scale=1.0, dk_layers=None, max_tokens=None, image_size=None, hidden=False, target=None,
                        ablate=None, reuse_prefix=False, lazy=None)
        bad, kw = set(kw) - set(defaults), {**defaults, **kw}  # the names run takes are the defaults' keys
        if bad:
            raise UserError(f"run takes no argument {sorted(bad)[0]!r}")
        dk_scale, dk_layers = self.check_dk(kw["dk_scale"], kw["dk_layers"])
        ablate = ablation_hooks(kw["ablate"], self.info) if kw["ablate"] else None  # checked before any work
        prep = self.prepare(x, max_tokens=kw["max_tokens"], image_size=kw["image_size"])
        dec = prepare_target(self, prep, kw["target"], kw["max_tokens"])
        hidden = kw["hidden"]
        table = merge(ablate, *self._context_hooks, hooks)
        # prefix reuse (a decoder's KV cache kept for the next run) only where nothing hooks this one: a hook or
        # a cache must see every token
        asked = kw["reuse_prefix"] and self.info.modality == "text" and dec is None
        reuse = asked and not table and cache is None and prefix.reusable(self) and set(prep.inputs) == {"input_ids"}
        keep = self._keep_lazily(prep, kw["lazy"], hidden, dec is not None, kv_cache=reuse)
        if reuse:
            return prefix.run(self, prep, dk_scale, dk_layers, hidden, lazy=keep)
        t = self.traced_run(prep, keep, hooks, cache, kw)
        out, ms = t.out, t.ms
        if self.info.modality == "text":
            line = prefix.not_reused(self, len(prep.tokens), hooked=bool(table)) if asked else ""
            return self._result(out, ms, prep.tokens, prep.special, dk_scale, hidden, truncated=prep.truncated,
                                notes=prep.notes, total_tokens=prep.total_tokens, reuse=line, routing=t.routing,
                                **(result_fields(out, dec, hidden) if dec is not None else {}))
        return self._image_result(out, ms, prep, dk_scale, hidden)

    def traced_run(self, prep: Prepared, keep: bool, hooks: Mapping, cache: tuple | None, kw: dict) -> Trace:
        """A run's one forward, through trace (so run and trace apply hooks in one order): kw's ablate, dk_scale and
        dk_layers; the maps (keep False) or each layer's q, k and lse (keep True); cache (names, store, every)
        fills store with the activations named (a lazy run never makes hook_pattern: asked by name, refused)."""
        names: list = []
        if cache is not None:
            names, store, every = cache
            lost = [n for n in names if n.endswith("attn.hook_pattern")] if keep else []
            if lost and not every:
                raise UserError(f"this run is lazy (no maps are kept), so {lost[0]} is never made; "
                                "read r.attention(layer, head, rows=..., cols=...) instead, or pass lazy=False")
            names = [n for n in names if n not in lost]
        if keep and any(n.endswith("attn.hook_pattern") for n in merge(*self._context_hooks, hooks)):
            raise UserError("this run is lazy (no maps are kept), so attn.hook_pattern is never "
                            "reached; read r.attention(layer, head, ...) instead, or pass lazy=False")
        t = Model.trace(self, prep, hooks, names, dk_scale=kw.get("dk_scale", 1.0), dk_layers=kw.get("dk_layers"),
                        attentions=not keep, lazy=keep, ablate=kw.get("ablate"))
        if cache is not None:
            store.update(t.cache)
        return t

    def token_count(self, prep: Prepared) -> int:
        """How many tokens the module will see for this prepared input."""
        if prep.tokens is not None:
            return len(prep.tokens)
        pixels = prep.inputs["pixels"]
        p = self.info.patch_size
        extra = len(self.extra_tokens())
        return (pixels.shape[-2] // p) * (pixels.shape[-1] // p) + extra

    def _keep_lazily(self, prep: Prepared, lazy: bool | None, hidden: bool, seq2seq: bool,
                     kv_cache: bool = False) -> bool:
        """Whether this run keeps q, k and lse instead of the maps, after the memory guard (api.keep.keep_lazily,
        with DENSE_MAX_BYTES and default_budget as they stand now)."""
        return keep_lazily(self, prep, lazy, hidden, seq2seq, DENSE_MAX_BYTES, default_budget(self.device),
                           kv_cache)

    def _head_shape(self) -> tuple[int, int, int]:
        """(query heads, key/value heads, head size) of the module's attention layers (api.keep.head_shape)."""
        return head_shape(self)

    def generate(self, prompt: str, max_new_tokens=32, temperature=0.0, top_k=None, chat: bool = False, seed=None):
        """Steps of generating text after prompt, each with its attention (decoders; see api.generate)."""
        from attn_explorer.api.generate import generate

        return generate(self, prompt, max_new_tokens, temperature, top_k, chat, seed)

    def dtype_error(self, x, **run_kw) -> dict:
        """How far this model's maps and last hidden state are from float32 on input x (api.precision)."""
        from attn_explorer.api.precision import dtype_error

        return dtype_error(self, x, **run_kw)

    def prepare(self, x, max_tokens: int | None = None, image_size: int | None = None) -> Prepared:
        """x made ready for the module, as run makes it (for analyses that run the module themselves)."""
        if self.info.modality == "text":
            return self._prepare_text(x, max_tokens)
        return self._prepare_image(x, image_size)

    def check_dk(self, dk_scale, dk_layers):
        dk_scale = dk_scale_value(dk_scale, "dk_scale")
        if dk_layers is not None:
            dk_layers = [int(i) for i in dk_layers]
            bad = [i for i in dk_layers if not 0 <= i < self.info.num_layers]
            if bad:
                raise UserError(f"layer {bad[0]} does not exist; the model has layers 0..{self.info.num_layers - 1}")
        return dk_scale, dk_layers

    def _forward(self, inputs: dict, dk_scale: float = 1.0, dk_layers=None, hooks: Hooks | None = None,
                 output_attentions: bool = True, grad: bool = False):
        """(out, ms, logits) of one forward pass with hooks (core.hooks.Hooks): hook_final on the last hidden
        state, and for a decoder whose hooks ask for hook_logits, the next-token logits (else None). A lazy
        forward (hooks.keep) leaves its store in out.lazy."""
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        logits = None
        ids = inputs.get("input_ids")
        long = self.device.type == "cpu" and ids is not None and ids.shape[-1] >= heap.LONG_ROWS
        # issue 24 A: a long forward's layers reuse the large blocks the last one freed instead of mapping them
        # anew; after it, glibc's own order of thresholds again, and what it freed goes back to the system
        with torch.inference_mode(not grad), torch.enable_grad() if grad else nullcontext(), \
                heap.large_blocks_kept() if long else nullcontext():
            t0 = time.perf_counter()
            try:
                out = self.module(dk_scale=dk_scale, dk_layers=dk_layers, output_attentions=output_attentions,
                                  hooks=hooks, **inputs)
                if hooks is not None:
                    out.hidden = hooks("hook_final", out.hidden)
                    if hooks.wants("hook_logits"):
                        logits = hooks("hook_logits", self.module.logits(out.hidden))
            except HookError as e:
                raise UserError(str(e)) from None
            sync()
            ms = (time.perf_counter() - t0) * 1000
        if self.device.type == "cpu":
            heap.tidy()  # what many short runs of varied length leave free in malloc's heap goes back (core.heap)
        if hooks is not None and hooks.keep:
            out.lazy = LazyAttention.from_kept(hooks.kept)
        self._first_pass, self._warm = not self._warm, True
        return out, ms, logits

    def _result(self, out, ms, tokens, special, dk_scale, hidden, **kw) -> RunResult:
        store = getattr(out, "lazy", None)
        if store is not None:  # a lazy run: the store instead of the maps (api.lazy)
            att, kw = NotKept(store.shape, store.dense_bytes), {**kw, "lazy": store}
        else:
            att = finite_attention(out.attentions[0].float().cpu().numpy())  # (L, H, N, N); NaN is refused
            att = np.ascontiguousarray(att, dtype=np.float32)
        return RunResult(
            attentions=att, tokens=tokens,
            special=np.asarray(special, dtype=bool), model=self.info.name, dk_scale=dk_scale, forward_ms=ms,
            warm_up=self._first_pass, hidden=out.hidden[0].float().cpu().numpy() if hidden else None,
            sinks=sinks.shares(self.module, att, store), **kw,
        )

    def _prepare_text(self, text, max_tokens) -> Prepared:
        if not isinstance(text, str):
            raise UserError(f"{self.info.name} is a text model; give it text, not {type(text).__name__}")
        text_size_ok(text)  # the same limit as a text file's
        visible_text(text)  # NUL, zero-width or white space only: empty
        limit = self.info.max_positions
        if max_tokens is not None:
            k = positive_int(max_tokens, "max_tokens")
            if k < self.info.min_tokens:
                raise UserError(f"the token limit must be at least {self.info.min_tokens} for {self.info.name} "
                                f"(its special tokens and one word), got {k}")
            limit = min(limit, k)
        if self._encode is not None:
            inputs, tokens, special, _, total = self._encode(text, limit)
        else:
            if self.tokenizer is None:
                raise UserError(f"{self.info.name} has no tokenizer (tokenizer.json or vocab.txt); it cannot read text")
            enc = self.tokenizer.encode(text, limit)
            tokens, special, total = enc.tokens, enc.special, enc.total
            inputs = {"input_ids": torch.tensor([enc.ids], device=self.device)}
            if self.info.family in ("bert", "roberta"):
                inputs["token_type_ids"] = torch.tensor([enc.type_ids], device=self.device)
        truncated = len(tokens) < total  # what was cut, not what might have been
        notes = []
        if truncated:
            why = ("the token limit you set" if max_tokens is not None and limit < self.info.max_positions
                   else f"the most {self.info.name} can read")
            notes.append(f"input truncated to its first {len(tokens)} tokens ({why})")
        return Prepared(inputs, tokens, special, total, truncated, notes)

    def _prepare_image(self, image, image_size) -> Prepared:
        if isinstance(image, str) and not image.strip():
            raise UserError("no image given")
        img = open_image(image)
        prep = self.preprocess
        notes = []
        if image_size is not None:
            p = self.info.patch_size
            side = int(image_size) // p * p
            if side < p:
                raise UserError(f"image_size must be at least one patch ({p} px), got {image_size}")
            if side > 2048:
                raise UserError(f"image_size {image_size} is too large (at most 2048 px)")
            if side != int(image_size):
                notes.append(f"image size rounded down to {side} px (whole {p}-px patches)")
            prep = prep.at_size(side)
        pixels, seen = prep(img)
        note = prep.crop_note(img.size)  # a landscape photo loses its sides: say so
        if note:
            notes.append(note)
        x = torch.from_numpy(pixels)[None].to(self.device, self.dtype)
        return Prepared({"pixels": x}, notes=notes, image=seen)

    def extra_tokens(self) -> list[str]:
        """The image model's tokens before its patches: [CLS] (none in SigLIP), then DeiT's [DIST]."""
        cfg = getattr(self.module, "cfg", None)
        cls, dist = getattr(cfg, "class_token", True), getattr(cfg, "distillation_token", self.info.family == "deit")
        return ["[CLS]"] * cls + ["[DIST]"] * dist

    def _image_result(self, out, ms, prep: Prepared, dk_scale, hidden) -> RunResult:
        rows, cols = out.grid
        extra = self.extra_tokens()
        tokens = extra + [f"r{r}c{c}" for r in range(rows) for c in range(cols)]
        special = [True] * len(extra) + [False] * (rows * cols)
        top5 = None
        if out.logits is not None and self.labels:
            p = torch.softmax(out.logits[0].float(), -1)
            vals, idx = p.topk(min(5, p.numel()))
            top5 = [(self.labels.get(int(i), str(int(i))), float(v)) for v, i in zip(vals, idx)]
        return self._result(out, ms, tokens, special, dk_scale, hidden, grid=(rows, cols), image=prep.image,
                            notes=prep.notes, top5=top5, total_tokens=len(tokens), patch_offset=len(extra))
