"""Head interventions: switch heads off, or patch them from another run, and measure what changes.

Every intervention is a hook on a head's output before W_O (blocks.{layer}.attn.hook_z, through the one
engine api.hooks.head_hook): z (B, N, H, d_v) -> torch.where(mask, replacement, z), where the mask says
which (copy, position, head) take the replacement and the replacement is
  "zero":  0;
  "mean":  that head's output averaged over this input's positions;
  a tensor: the same head's output in another run (patching: clean -> corrupt).
A scan puts one intervention in each copy of a batch (copy b switches off head h_b), so 270 heads of
SmolLM2 take a few forward passes, not 270.

The effect is measured in a form that fits the model (analysis.metrics.Metric):
  decoders:         the next token's log-probability of a target token, or the logit difference
                    target − foil;
  text encoders:    the cosine similarity of the sentence embedding (mean-pooled last hidden state over
                    the real tokens, as sentence-transformers computes it for MiniLM) with the clean run's;
  image classifiers: the class probability (tiny-vit-digits);
  image backbones:  the cosine similarity of the [CLS] embedding with the clean run's.
Only NumPy arrays and plain values leave this module (`Scan`, `Patched`, `Comparison`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import torch

from attn_explorer.analysis.metrics import Metric, embedding, is_classifier, is_decoder, make_metric
from attn_explorer.api.hooks import ABLATIONS, head_hook, head_mask, heads_of
from attn_explorer.api.model import Model
from attn_explorer.api.vlm import analysis as vlm_analysis
from attn_explorer.budget import default_budget
from attn_explorer.errors import UserError
from attn_explorer.validate import existing_head

KINDS = ABLATIONS  # ablations; a tensor replacement is patching
MAX_BATCH = 96  # copies per forward pass at most: past this the CPU gains nothing and memory grows
RUN_KEYS = ("max_tokens", "image_size", "dk_scale", "dk_layers")  # of a run's keywords, what a scan keeps


# ---- the forward pass -----------------------------------------------------------------------------------

def _expand(inputs: dict, copies: int) -> dict:
    """The module's inputs for `copies` copies of one input (views, no copy made)."""
    return {k: v.expand(copies, *v.shape[1:]) if torch.is_tensor(v) else v for k, v in inputs.items()}


def z_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_z"


def forward(model: Model, inputs: dict, plans: dict | None = None, copies: int = 1, run_kw: dict | None = None,
            save_ctx: bool = False) -> tuple[Any, dict]:
    """One forward pass (Model.trace) of `copies` copies of the input with plans {layer: [(mask, source), ...]}
    applied as hooks on blocks.{layer}.attn.hook_z (api.hooks.head_hook; masks broadcastable to (B, N, H, 1)),
    no maps kept. Returns (the module's output, {layer: z after its hook (B, N, H, d_v)} when save_ctx)."""
    kw = run_kw or {}
    if copies > 1 and model.info.modality == "image-text":  # one picture per forward (core.vlm): copy by copy
        parts = [forward(model, inputs, _one_copy(plans, b, copies), 1, run_kw, save_ctx) for b in range(copies)]
        return (replace(parts[0][0], hidden=torch.cat([o.hidden for o, _ in parts])),
                {i: torch.cat([c[i] for _, c in parts]) for i in parts[0][1]})
    hooks = {z_name(layer): head_hook(edits) for layer, edits in (plans or {}).items()}
    names = [z_name(i) for i in range(model.info.num_layers)] if save_ctx else ()
    with vlm_analysis("interventions"):  # a vision-language model's trace serves this analysis (api.vlm)
        t = model.trace(inputs if copies == 1 else _expand(inputs, copies), hooks, names,  # (tiles stay tiles)
                        dk_scale=kw.get("dk_scale", 1.0), dk_layers=kw.get("dk_layers"))
    return t.out, ({i: t.cache[z_name(i)] for i in range(model.info.num_layers)} if save_ctx else {})


def _one_copy(plans: dict | None, b: int, copies: int) -> dict:
    """Copy b's part of plans made for `copies` copies: masks and replacement tensors with one row per copy
    keep row b; those made for every copy (one row) stay."""
    def row(t):
        return t[b:b + 1] if torch.is_tensor(t) and t.dim() and t.shape[0] == copies else t

    return {layer: [(row(m), row(src)) for m, src in edits] for layer, edits in (plans or {}).items()}


def prepare(model: Model, x, run_kw: dict | None = None):
    """x made ready as `model.run` makes it, with the run's cut and image size (a vision-language model: x is the
    pair (image, text))."""
    kw = run_kw or {}
    if model.info.encoder_decoder:
        raise UserError("interventions are not supported yet for encoder-decoders (BART)")
    return model.prepare(x, max_tokens=kw.get("max_tokens"), image_size=kw.get("image_size"))


def metric(model: Model, x, target=None, foil=None, **run_kw) -> Metric:
    """The metric that fits `model` for input x (runs x once: the reference and the default target)."""
    prep = prepare(model, x, run_kw)
    out, _ = forward(model, prep.inputs, run_kw=run_kw)
    return make_metric(model, prep, out, target, foil)


# ---- checks ---------------------------------------------------------------------------------------------

def check_heads(info, heads) -> list[tuple[int, int]]:
    """[(layer, head), ...] that exist in the model, or one UserError line."""
    out = []
    for key in heads:
        try:
            layer, head = (int(v) for v in key)
        except (TypeError, ValueError):
            raise UserError(f"a head is (layer, head), got {key!r}") from None
        out.append(existing_head(layer, head, info.num_layers, heads_of(info, layer) if 0 <= layer < info.num_layers
                                 else info.num_heads, info.name))
    return out


def check_positions(positions, n: int) -> list[int] | None:
    if positions is None:
        return None
    out = []
    for p in positions:
        p = int(p)
        if not -n <= p < n:
            raise UserError(f"no position {p}: the input has {n} tokens (0..{n - 1})")
        out.append(p % n)
    return out


def same_length(clean_prep, corrupt_prep, model: Model) -> int:
    n, m = model.token_count(clean_prep), model.token_count(corrupt_prep)
    if n != m:
        raise UserError(f"the clean input has {n} tokens and the corrupt one {m}: patching needs the same number "
                        "of tokens (swap words of one token each, e.g. names)")
    return n


def batch_size(model: Model, n_tokens: int, jobs: int) -> int:
    """How many copies one forward pass takes: what a quarter of the memory budget holds (activations of
    the widest layer, the explicit path's maps, a vocabulary row), at most MAX_BATCH."""
    i = model.info
    item = model.dtype.itemsize
    per_copy = n_tokens * i.hidden_size * 24 * item + 2 * i.num_heads * n_tokens * n_tokens * item + 262_144 * 4
    fit = default_budget(model.device) // 4 // max(per_copy, 1)
    return int(max(1, min(jobs, fit, MAX_BATCH)))


def _report(progress, done: int, total: int, what: str) -> None:
    if progress is not None:
        progress(done / max(total, 1), f"{done} of {total} {what}")


# ---- single runs ----------------------------------------------------------------------------------------

def head_plans(model: Model, heads: dict) -> dict:
    """{(layer, head): "zero" | "mean"} -> {layer: [(mask (1, 1, H, 1), kind), ...]}, one edit per kind."""
    per_layer: dict[int, dict[str, list[int]]] = {}
    for (layer, head), how in heads.items():
        if how not in KINDS:
            raise UserError(f"unknown intervention {how!r} for L{layer} H{head}: use 'zero' or 'mean'")
        per_layer.setdefault(layer, {}).setdefault(how, []).append(head)
    return {layer: [(head_mask(hs, heads_of(model.info, layer)), how) for how, hs in kinds.items()]
            for layer, kinds in per_layer.items()}


@dataclass
class Comparison:
    """The effect of one set of interventions on one input, as a page draws it."""

    kind: str  # "decoder" (next-token bars), "classifier" (class bars), "similarity" (one number)
    metric: str  # what `before`/`after` are for decoders and classifiers: "p(next token)", "p(class)"
    labels: list[str] = field(default_factory=list)  # the bars: tokens or classes
    before: np.ndarray = field(default_factory=lambda: np.zeros(0))  # probabilities, clean run
    after: np.ndarray = field(default_factory=lambda: np.zeros(0))  # probabilities, heads switched off
    similarity: float = 1.0  # cosine of the embeddings (1: unchanged); decoders: of the last hidden state
    heads: int = 0  # how many heads were switched off
    tokens: list[str] = field(default_factory=list)  # the input's tokens


def compare(model: Model, x, ablate: dict, top: int = 8, **run_kw) -> Comparison:
    """The clean run and the run with `ablate` ({(layer, head): "zero" | "mean"}) side by side, in one
    forward pass of two copies: decoders' next-token probabilities (the top of either run), classifiers'
    class probabilities, or the embeddings' cosine similarity."""
    heads = dict(zip(check_heads(model.info, ablate), ablate.values()))
    prep = prepare(model, x, run_kw)
    plans = {l: [(torch.cat([torch.zeros_like(m), m]), how) for m, how in edits]  # copy 0 clean, copy 1 not
             for l, edits in head_plans(model, heads).items()}
    with torch.inference_mode():
        out, _ = forward(model, prep.inputs, plans, 2, run_kw)
        return _compared(model, out, top, len(heads), list(prep.tokens or []))


def _compared(model: Model, out, top: int, n_heads: int, tokens: list[str]) -> Comparison:
    """Copy 0 (clean) against copy 1 (intervened) of one forward's output."""
    if is_decoder(model):
        p = torch.softmax(model.module.logits(out.hidden[:, -1]).float(), dim=-1)  # (2, vocab)
        ids = list(dict.fromkeys(p[0].topk(top).indices.tolist() + p[1].topk(top).indices.tolist()))
        ids.sort(key=lambda i: -float(p[0, i]))
        sim = float(torch.nn.functional.cosine_similarity(out.hidden[0, -1].float(), out.hidden[1, -1].float(), dim=0))
        return Comparison("decoder", "p(next token)", model.tokenizer.display(ids), p[0, ids].cpu().numpy(),
                          p[1, ids].cpu().numpy(), sim, n_heads, tokens)
    if is_classifier(model):
        p = torch.softmax(out.logits.float(), dim=-1)
        n = p.shape[-1]
        labels = [str(model.labels.get(i, i)) for i in range(n)]
        emb = embedding(out.hidden, "cls")
        sim = float(torch.nn.functional.cosine_similarity(emb[0], emb[1], dim=0))
        return Comparison("classifier", "p(class)", labels, p[0].cpu().numpy(), p[1].cpu().numpy(), sim,
                          n_heads, tokens)
    pool = "cls" if model.info.modality == "image" else "mean"
    emb = embedding(out.hidden, pool)
    sim = float(torch.nn.functional.cosine_similarity(emb[0], emb[1], dim=0))
    return Comparison("similarity", f"cosine similarity of the {'[CLS]' if pool == 'cls' else 'sentence'} embedding",
                      similarity=sim, heads=n_heads, tokens=tokens)


# ---- scans ----------------------------------------------------------------------------------------------

@dataclass
class Scan:
    """One intervention per cell, and the metric each gave."""

    kind: str  # "ablation", "patch-head" (rows layers, columns heads), "patch-position" (columns tokens)
    metric: str  # Metric.label
    values: np.ndarray  # float64 (L, H) or (L, N): the metric with that cell's intervention
    clean: float  # the metric of the clean run, nothing changed
    corrupt: float | None = None  # patching: the metric of the corrupt run, nothing patched
    how: str = "zero"  # ablation: "zero" or "mean"; patching: "clean -> corrupt"
    tokens: list[str] = field(default_factory=list)  # the (clean) input's tokens
    passes: int = 0  # forward passes the scan took (after the clean and corrupt runs)
    # issue 25 (hybrids): bool, values' shape, False for a head its layer does not have (ModelInfo.layer_heads); its
    # value is the metric of nothing changed (clean, or corrupt for a patch: effect 0), as the maps hold 0 there
    exists: np.ndarray | None = None

    def __post_init__(self):
        if self.exists is None:
            self.exists = np.ones(np.shape(self.values), dtype=bool)

    @property
    def effect(self) -> np.ndarray:
        """Ablation: metric − clean metric (0: the head does not matter here). Patching: the share of the
        clean − corrupt gap the cell restores (1: all of it; 0: none), or metric − corrupt when there is no gap."""
        if self.corrupt is None:
            return self.values - self.clean
        gap = self.clean - self.corrupt
        return (self.values - self.corrupt) / gap if abs(gap) > 1e-9 else self.values - self.corrupt

    @property
    def effect_label(self) -> str:
        if self.corrupt is None:
            return "change of the metric"
        return "share of the clean − corrupt gap restored" if abs(self.clean - self.corrupt) > 1e-9 else \
            "metric − corrupt metric"

    def ranked(self, top: int | None = None) -> list[tuple[int, int, float]]:
        """(row, column, effect), the largest |effect| first."""
        e = self.effect
        order = np.argsort(-np.abs(e), axis=None, kind="stable")
        order = order[self.exists.flat[order]]  # never a head its layer does not have
        cols = e.shape[1]
        picked = order if top is None else order[:top]
        return [(int(k // cols), int(k % cols), float(e.flat[k])) for k in picked]

    def to_dict(self) -> dict:
        """Plain data for a .json file."""
        return {"kind": self.kind, "metric": self.metric, "how": self.how, "clean": self.clean,
                "corrupt": self.corrupt, "tokens": list(self.tokens), "values": self.values.tolist(),
                "effect": self.effect.tolist(), "effect_label": self.effect_label, "passes": self.passes,
                "ranked": [list(r) for r in self.ranked(20)], "exists": self.exists.tolist()}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Arrays for a .npz file (strings as NumPy unicode: no pickles)."""
        d = {"values": self.values, "effect": self.effect, "clean": np.asarray(self.clean),
             "tokens": np.asarray(self.tokens, dtype=np.str_), "kind": np.asarray(self.kind, dtype=np.str_),
             "metric": np.asarray(self.metric, dtype=np.str_), "how": np.asarray(self.how, dtype=np.str_),
             "effect_label": np.asarray(self.effect_label, dtype=np.str_), "passes": np.asarray(self.passes),
             "exists": self.exists}
        if self.corrupt is not None:
            d["corrupt"] = np.asarray(self.corrupt)
        return d


def _scan(model: Model, inputs, n: int, jobs: list, cell: Callable, source, metric: Metric, run_kw: dict,
          batch: int | None, progress, what: str) -> tuple[np.ndarray, int]:
    """The metric for each job, `batch` jobs per forward pass (copy b carries job b): cell(job) -> (layer,
    index into that copy's (N, H) or (1, H) mask, the mask's shape) says where the job acts; source is one
    replacement for every layer, or a list of one per layer."""
    size = batch or batch_size(model, n, len(jobs))
    values = np.empty(len(jobs))
    passes = 0
    _report(progress, 0, len(jobs), what)
    for start in range(0, len(jobs), size):
        chunk = jobs[start:start + size]
        masks: dict[int, torch.Tensor] = {}
        for b, job in enumerate(chunk):
            layer, idx, shape = cell(job)
            masks.setdefault(layer, torch.zeros(len(chunk), *shape, 1, dtype=torch.bool))[(b, *idx)] = True  # (B, N|1, H, 1)
        plans = {layer: [(m, source[layer] if isinstance(source, list) else source)] for layer, m in masks.items()}
        with torch.inference_mode():
            out, _ = forward(model, inputs, plans, len(chunk), run_kw)
            values[start:start + len(chunk)] = metric(model.module, out).double().cpu().numpy()
        passes += 1
        _report(progress, start + len(chunk), len(jobs), what)
    return values, passes


def ablation_scan(model: Model, x, metric: Metric | None = None, how: str = "zero", batch: int | None = None,
                  progress=None, target=None, foil=None, **run_kw) -> Scan:
    """Switch off each head in turn ("zero" or "mean"): an L×H grid of the metric. progress(fraction,
    message) is called after each forward pass (it may raise to cancel)."""
    if how not in KINDS:
        raise UserError(f"unknown ablation {how!r}: use 'zero' or 'mean'")
    run_kw = {k: v for k, v in run_kw.items() if k in RUN_KEYS}
    prep = prepare(model, x, run_kw)
    with torch.inference_mode():
        clean_out, _ = forward(model, prep.inputs, run_kw=run_kw)
        metric = metric or make_metric(model, prep, clean_out, target, foil)
        clean = float(metric(model.module, clean_out)[0])
    jobs = _every_head(model.info)
    values, passes = _scan(model, prep.inputs, model.token_count(prep), jobs,
                           lambda j: (j[0], (0, j[1]), (1, heads_of(model.info, j[0]))), how,
                           metric, run_kw, batch, progress, "heads")
    grid, exists = _grid(model.info, jobs, values, clean)
    return Scan("ablation", metric.label, grid, clean, how=how, tokens=list(prep.tokens or []), passes=passes,
                exists=exists)


def _every_head(info) -> list[tuple[int, int]]:
    """Every (layer, head) that exists: a hybrid's layers may have fewer heads than num_heads (layer_heads)."""
    return [(l, h) for l in range(info.num_layers) for h in range(heads_of(info, l))]


def _grid(info, jobs: list, values: np.ndarray, nothing: float) -> tuple[np.ndarray, np.ndarray]:
    """The L×H grid of per-head values and where a head exists: a hybrid's narrower layers have no heads past
    their own, whose cells hold `nothing` (the metric with nothing changed: no NaN in a grid or a file)."""
    grid = np.full((info.num_layers, info.num_heads), float(nothing))
    exists = np.zeros(grid.shape, dtype=bool)
    for (l, h), v in zip(jobs, values):
        grid[l, h], exists[l, h] = v, True
    return grid, exists


def _clean_and_corrupt(model: Model, clean, corrupt, metric, target, foil, run_kw):
    """Both inputs prepared, the clean run's every-layer ctx, the metric and its value on both runs."""
    cp, xp = prepare(model, clean, run_kw), prepare(model, corrupt, run_kw)
    n = same_length(cp, xp, model)
    with torch.inference_mode():
        clean_out, caps = forward(model, cp.inputs, run_kw=run_kw, save_ctx=True)
        metric = metric or make_metric(model, cp, clean_out, target, foil)
        corrupt_out, _ = forward(model, xp.inputs, run_kw=run_kw)
        values = float(metric(model.module, clean_out)[0]), float(metric(model.module, corrupt_out)[0])
    ctx = [caps[l] for l in range(model.info.num_layers)]  # (1, N, H, d_v) each: z after hook_z
    return cp, xp, n, ctx, metric, values


def patching_scan(model: Model, clean, corrupt, metric: Metric | None = None, per: str = "head", batch: int | None = None,
                  progress=None, target=None, foil=None, **run_kw) -> Scan:
    """Activation patching clean -> corrupt: run the corrupt input with one cell taken from the clean run,
    per="head": one head's output at every position; per="position": every head of one layer at one
    position. The metric of each, in an L×H or L×N grid."""
    if per not in ("head", "position"):
        raise UserError(f"unknown patching {per!r}: use 'head' or 'position'")
    run_kw = {k: v for k, v in run_kw.items() if k in RUN_KEYS}
    cp, xp, n, ctx, metric, (c, k) = _clean_and_corrupt(model, clean, corrupt, metric, target, foil, run_kw)
    L, info = model.info.num_layers, model.info
    if per == "head":
        jobs = _every_head(info)
        cell = (lambda j: (j[0], (slice(None), j[1]), (n, heads_of(info, j[0]))))
    else:
        jobs = [(l, p) for l in range(L) for p in range(n)]
        cell = (lambda j: (j[0], (j[1], slice(None)), (n, heads_of(info, j[0]))))
    values, passes = _scan(model, xp.inputs, n, jobs, cell, ctx, metric, run_kw, batch, progress,
                           "heads" if per == "head" else "(layer, position) cells")
    grid, exists = _grid(info, jobs, values, k) if per == "head" else (values.reshape(L, -1), None)
    return Scan(f"patch-{per}", metric.label, grid, c, corrupt=k, how="clean -> corrupt",
                tokens=list(cp.tokens or []), passes=passes, exists=exists)


@dataclass
class Patched:
    """One patching experiment: the metric on the clean run, the corrupt run and the patched corrupt run."""

    metric: str
    clean: float
    corrupt: float
    patched: float

    @property
    def restored(self) -> float:
        """The share of the clean − corrupt gap the patch restores (nan when there is no gap)."""
        gap = self.clean - self.corrupt
        return (self.patched - self.corrupt) / gap if abs(gap) > 1e-9 else float("nan")


def patch(model: Model, clean, corrupt, metric: Metric | None = None, heads=None, positions=None, target=None, foil=None,
          **run_kw) -> Patched:
    """Run `corrupt` with `heads` ([(layer, head)]; None: every head of every layer) taking their outputs
    from the `clean` run at `positions` (token indices; None: all). Same token count required."""
    run_kw = {k: v for k, v in run_kw.items() if k in RUN_KEYS}
    cp, xp, n, ctx, metric, (c, k) = _clean_and_corrupt(model, clean, corrupt, metric, target, foil, run_kw)
    heads = _every_head(model.info) if heads is None else check_heads(model.info, heads)
    pos = check_positions(positions, n)
    masks: dict[int, torch.Tensor] = {}
    for layer, head in heads:
        H = heads_of(model.info, layer)
        masks.setdefault(layer, torch.zeros(1, n, H, 1, dtype=torch.bool))[0, slice(None) if pos is None else pos, head] = True
    plans = {layer: [(m, ctx[layer])] for layer, m in masks.items()}
    with torch.inference_mode():
        out, _ = forward(model, xp.inputs, plans, 1, run_kw)
        patched = float(metric(model.module, out)[0])
    return Patched(metric.label, c, k, patched)
