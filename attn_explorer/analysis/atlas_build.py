"""Building an atlas: documents cut into segments the model reads whole, each run once with lazy attention
(q, k and each row's log-sum-exp kept, never a map). Per layer, one pass over row chunks of its probabilities
gives every row's value by each metric (analysis.atlas_math.layer_values); the metrics' sums take them all,
and each head's heaps are offered only the rows among its layer's top_k by a metric (torch.topk), whose keys
come from those few rows worked out again. Memory is bounded whatever the corpus: one segment's kept tensors,
one chunk of probabilities, the heaps, and the texts the heaps point at (Pointed).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np

from attn_explorer.analysis.atlas import METRICS, WINDOW, Atlas, Example, TopK
from attn_explorer.errors import UserError

if TYPE_CHECKING:
    from attn_explorer.api.model import Model

CONTEXT = 1024  # tokens per segment (at most the model's positions)
MAX_FILE_BYTES = 64_000_000  # one document file; the atlas reads it segment by segment
ROW_KINDS = METRICS  # what a row is ranked by; "weight" ranks (query, key) pairs


def check_model(model: Model) -> None:
    info = model.info
    if info.modality != "text":
        raise UserError(f"{info.name} reads images; the atlas takes text")
    if info.encoder_decoder:
        raise UserError(f"{info.name} is an encoder-decoder; the atlas takes encoders and decoders")
    other = sorted({m for m in info.mixers if m != "softmax"})
    if other:
        raise UserError(f"{info.family}: the atlas measures softmax attention heads, and this model's "
                        f"{', '.join(other)} layers have no softmax map")


# ---- where documents come from: files, folders, the bundled corpus ----------------------------------------
def corpus_files(files=(), folders=()) -> list[Path]:
    """The files named, then each folder's .txt files in name order; with none, the bundled corpus."""
    out = [Path(f) for f in files]
    for d in folders:
        d = Path(d)
        if not d.is_dir():
            raise UserError(f"folder {d}: no such folder")
        found = sorted(p for p in d.iterdir() if p.suffix.lower() == ".txt" and p.is_file())
        if not found:
            raise UserError(f"folder {d} has no .txt files")
        out += found
    if not out:
        from attn_explorer.resources import resource_path

        out = sorted(resource_path("corpus").glob("*.txt"))
        if not out:
            raise UserError(f"the bundled corpus is missing ({resource_path('corpus')}); reinstall attn-explorer "
                            "or give --text-file / --folder")
    return out


def read_documents(paths, per_line: bool = False):
    """(name, text) for each document: one a file, or one a non-blank line (named file:line); one file read at a
    time, so build_atlas streams them. An unreadable or empty file is one UserError line."""
    from attn_explorer.files import read_text_file

    for p in paths:
        p = Path(p)
        text = read_text_file(p, MAX_FILE_BYTES)
        if not per_line:
            yield p.name, text
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                yield f"{p.name}:{i}", line


def _units(text: str) -> list[str]:
    """Paragraphs (blank-line separated), or lines when a text has no blank lines."""
    from attn_explorer.validate import has_visible_text

    paras = [p.strip() for p in text.replace("\r\n", "\n").split("\n\n")]
    paras = [p for p in paras if p]
    if len(paras) <= 1:
        paras = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return [p for p in paras if has_visible_text(p)]


def _count(model: Model, text: str) -> int:
    return model.prepare(text, max_tokens=None).total_tokens


def segments(model: Model, text: str, context: int) -> Iterator[tuple[str, int]]:
    """A document cut at paragraph (else line, else word) boundaries into (text, tokens) pieces that the model
    reads in at most `context` tokens each, special tokens included."""
    budget = max(1, context - (model.info.min_tokens - 1))
    cur: list[str] = []
    cur_n = 0
    for unit in _units(text):
        n = _count(model, unit) - (model.info.min_tokens - 1)
        pieces = [(unit, n)] if n <= budget else list(_split_words(model, unit, budget))
        for piece, pn in pieces:
            if cur and cur_n + pn + 1 > budget:
                yield "\n\n".join(cur), cur_n + model.info.min_tokens - 1
                cur, cur_n = [], 0
            cur.append(piece)
            cur_n += pn + (1 if len(cur) > 1 else 0)
    if cur:
        yield "\n\n".join(cur), cur_n + model.info.min_tokens - 1


def _split_words(model: Model, unit: str, budget: int) -> Iterator[tuple[str, int]]:
    words = unit.split()
    lo = 0
    while lo < len(words):
        hi = min(len(words), lo + max(1, budget // 2))
        piece = " ".join(words[lo:hi])
        n = _count(model, piece) - (model.info.min_tokens - 1)
        while n > budget and hi - lo > 1:
            hi = lo + (hi - lo) // 2
            piece = " ".join(words[lo:hi])
            n = _count(model, piece) - (model.info.min_tokens - 1)
        yield piece, min(n, budget)
        lo = hi


def _named(documents) -> Iterator[tuple[str, str]]:
    for i, d in enumerate(documents):
        if isinstance(d, tuple):
            yield str(d[0]), str(d[1])
        else:
            yield f"document {i + 1}", str(d)


def count_tokens(model: Model, documents, context: int = CONTEXT) -> int:
    """Tokens an atlas of these documents reads (the segments' tokens, special tokens included)."""
    return sum(n for _, text in _named(documents) for _, n in segments(model, text, context))


def context_window(tokens: list[str], q: int, k: int, w: int = WINDOW) -> tuple[list[str], int, int]:
    """Up to w tokens either side of the query and the key; one span when they are close, else the key's span,
    "…", the query's span. Returns (tokens, query_at, key_at)."""
    a, b = min(q, k), max(q, k)
    if b - a <= 2 * w:
        lo, hi = max(0, a - w), min(len(tokens), b + w + 1)
        return list(tokens[lo:hi]), q - lo, k - lo
    first, second = (k, q) if k < q else (q, k)
    lo1, hi1 = max(0, first - w), first + w + 1
    lo2, hi2 = second - w, min(len(tokens), second + w + 1)
    out = list(tokens[lo1:hi1]) + ["…"] + list(tokens[lo2:hi2])
    at1, at2 = first - lo1, (hi1 - lo1) + 1 + second - lo2
    return (out, at2, at1) if k < q else (out, at1, at2)


def build_atlas(model: Model, documents: Iterable, *, top_k: int = 8, max_tokens: int | None = None,
                progress: Callable[[int, int], None] | None = None, stop: Callable[[], bool] | None = None,
                context: int | None = None, total_tokens: int | None = None) -> Atlas:
    """Stream `documents` (strings) through `model` and measure every head (see the module's docstring).

    top_k: examples kept per head and per ranking (the weight and each metric). max_tokens: stop after this many
    tokens of the corpus (None: all). progress(done_tokens, total_tokens) after each chunk; stop() returning
    True ends the run early: the Atlas then covers the tokens seen and says it is incomplete (core.progress.
    Stopped is raised only if nothing was measured). documents: strings, or (name, text) pairs. context: tokens
    per segment (default 1024, at most the model's positions). total_tokens: the total progress reports (counted
    first when documents is a list; else 0 = unknown, unless max_tokens is given)."""
    import torch

    from attn_explorer.analysis import atlas_math as am
    from attn_explorer.api.hooks import heads_first
    from attn_explorer.core.progress import Stopped, watching

    check_model(model)
    info = model.info
    L, H = info.num_layers, info.num_heads
    context = min(int(context or CONTEXT), info.max_positions)
    if context < info.min_tokens + 1:
        raise UserError(f"segments of {context} tokens are too short for {info.name}")
    top_k = int(top_k)
    if top_k < 1:
        raise UserError(f"top_k must be at least 1, got {top_k}")
    if total_tokens is None:
        if isinstance(documents, (list, tuple)):
            total_tokens = count_tokens(model, documents, context)
        else:
            total_tokens = 0
    if max_tokens is not None:
        total_tokens = min(total_tokens, int(max_tokens)) if total_tokens else int(max_tokens)
    copy = am.CopyReader(model)
    kinds = ("weight",) + METRICS
    heaps = {(l, h, kind): TopK(top_k) for l in range(L) for h in range(H) for kind in kinds}
    floors = torch.full((L, len(kinds), H), float("-inf"))  # each heap's floor, kinds in am.KINDS' order
    sums = {name: np.zeros((L, H)) for name in METRICS}
    counts = {name: np.zeros((L, H)) for name in METRICS}
    pointed = Pointed()  # the texts of the segments the heaps point at
    done, seg_id, docs = 0, -1, 0
    stopped = False
    v_names = [f"blocks.{l}.attn.hook_v" for l in range(L)] if copy.ok else []

    def offer(key, score, item: tuple) -> None:  # item: (segment, query, key, weight, kind, score)
        kept, out = heaps[key].offer(score, item)
        if kept:
            pointed.kept(item[0])
        if out is not None:
            pointed.dropped(out[0])

    for name, text in _named(documents):
        docs += 1
        for seg_text, _ in segments(model, text, context):
            if stop is not None and stop():
                stopped = True
                break
            if max_tokens is not None and done >= max_tokens:
                break
            limit = context if max_tokens is None else max(info.min_tokens, min(context, max_tokens - done))
            prep = model.prepare(seg_text, max_tokens=limit)
            try:
                with watching(stop=stop):
                    t = model.trace(prep, names=v_names, lazy=True)
            except Stopped:
                stopped = True
                break
            seg_id += 1
            ids = prep.inputs["input_ids"][0].cpu()
            special = np.asarray(prep.special, dtype=bool)
            n = len(prep.tokens)
            pairs = am.segment_pairs(ids.numpy(), special)
            rows = _row_masks(pairs, n, info.causal)  # (len(KINDS), n): the rows each kind counts
            for i, kind in enumerate(am.KINDS):  # rows counted: the same for every head and layer
                if kind not in ("weight", "copy"):
                    counts[kind] += float(rows[i].sum())
            weights = rows.double()[:, None, :]
            plans: dict = {}  # the row chunks' index work, shared by the layers
            with torch.inference_mode():
                u = copy.distinct(ids) if copy.ok else None
                for l, lz in enumerate(t.lazy.layers):
                    zs = None
                    if copy.ok:
                        v = heads_first(t.cache[f"blocks.{l}.attn.hook_v"], H)[0].float()  # (H, n, d)
                        zs = am.sinkless(copy.z(l, v, ids, u), pairs)
                    ka = am.widened_keys(lz)
                    vals = am.layer_values(lz, pairs, zs, info.causal, plans, ka)  # (len(KINDS), H, n)
                    total = (vals.double() * weights).sum(-1).numpy()  # (len(KINDS), H)
                    for i, kind in enumerate(am.KINDS):
                        if kind != "weight":
                            sums[kind][l] += total[i]
                    if zs is not None:  # the copy score's weights: each row's weight on keys that are not sinks
                        counts["copy"][l] += ((1.0 - vals[am.KINDS.index("sink")].double()) * weights[
                            am.KINDS.index("copy")]).sum(-1).numpy()
                    _offer_layer(l, lz, ka, vals, rows, zs, pairs, floors, top_k, seg_id, offer, heaps)
            del t
            pointed.end(seg_id, (seg_text, limit, name))
            done += n
            if progress is not None:
                progress(done, max(total_tokens, done))
        if stopped or (max_tokens is not None and done >= max_tokens):
            break
    if seg_id < 0:
        if stopped:
            raise Stopped("stopped before the first segment: nothing was measured")
        raise UserError("the corpus has no text to read")
    metrics = {k: np.where(counts[k] > 0, sums[k] / np.maximum(counts[k], 1e-30), np.nan) for k in METRICS}
    notes = {k: am_note for k, am_note in _notes(copy, context).items()}
    if not copy.ok:
        metrics["copy"] = np.full((L, H), np.nan)
    texts = pointed.texts
    tokens = {d: model.prepare(text, max_tokens=lim).tokens for d, (text, lim, _) in texts.items()}  # as read
    examples: dict[tuple[int, int], list[Example]] = {}
    for (l, h, kind), heap in heaps.items():
        for d, q, k, w, kd, score in heap.best():
            toks, qa, ka = context_window(tokens[d], q, k)
            examples.setdefault((l, h), []).append(Example(d, q, k, w, kd, toks, qa, ka, score))
    return Atlas(model=info.name, n_layers=L, n_heads=H, tokens=done, documents=docs, metrics=metrics,
                 examples=examples, notes=notes, complete=not stopped,
                 texts={d: t[0] for d, t in texts.items()}, sources={d: t[2] for d, t in texts.items()})


class Pointed:
    """The texts of the segments heap items point at, with how many point at each: all an atlas keeps of its
    corpus, bounded by its heaps whatever the corpus size."""

    def __init__(self):
        self.refs: dict[int, int] = {}  # segment -> heap items pointing at it
        self.texts: dict[int, tuple] = {}  # segment -> (text, its token limit, source), while pointed at

    def kept(self, seg: int) -> None:
        self.refs[seg] = self.refs.get(seg, 0) + 1

    def dropped(self, seg: int) -> None:
        self.refs[seg] -= 1

    def end(self, seg: int, text: tuple) -> None:
        """Segment seg is done: keep its text if anything points at it; forget every segment nothing points at."""
        if self.refs.get(seg, 0) > 0:
            self.texts[seg] = text
        for d in [d for d, c in self.refs.items() if c <= 0]:
            self.refs.pop(d)
            self.texts.pop(d, None)


def _notes(copy, context: int) -> dict[str, str]:
    out = {"segments": f"documents cut into segments of at most {context} tokens, each read whole"}
    out["copy"] = copy.reason if not copy.ok else (
        "z-score of the attended token's logit in the head's direct OV output (final norm's gain, W_U), "
        "weighted by attention to keys that are not sinks")
    out["examples"] = ("top pairs by weight, one a query row (a token on itself and sinks left out); by a metric: "
                       "the rows where it is largest, the key being where that row's metric comes from")
    return out


def _row_masks(pairs, n: int, causal: bool):
    """(len(KINDS), n) bool: the rows each kind counts (and may take examples from): all but a decoder's first
    token (its one key is itself); prev_token rows 1..; duplicate / induction rows that have an earlier copy."""
    import torch

    from attn_explorer.analysis.atlas_math import KINDS

    base = torch.ones(n, dtype=torch.bool)
    if causal:
        base[0] = False
    at = torch.arange(n)
    own = {"weight": torch.ones(n, dtype=torch.bool), "prev_token": at >= 1,
           "duplicate": torch.isin(at, pairs.dup_rows), "induction": torch.isin(at, pairs.ind_rows)}
    return torch.stack([own.get(kind, base) for kind in KINDS])


def _offer_layer(l, lz, ka, vals, rows, zs, pairs, floors, top_k, seg_id, offer, heaps) -> None:
    """Offer one layer's rows to its heads' heaps, every kind at once: the rows above a heap's floor (L, kinds, H)
    that are among its head's top_k of the layer (ties kept), with the key each points at (their probabilities
    worked out again, for those rows only). floors[l] is updated."""
    import torch

    from attn_explorer.analysis import atlas_math as am

    K, H, n = vals.shape
    live = [i for i, kind in enumerate(am.KINDS) if kind != "copy" or zs is not None]
    v = vals[live].masked_fill(~rows[live][:, None, :], float("-inf"))  # (K', H, n)
    kth = v.topk(min(top_k, n), dim=-1).values[..., -1:]  # each head's k-th best row of this layer
    cand = (v > floors[l, live][..., None]) & (v >= kth) & (v > float("-inf"))
    cand[0] &= v[0] > 0  # "weight" (first): a row with no weight off itself and the sinks has no example
    kk, hs, rs = torch.nonzero(cand, as_tuple=True)
    if len(kk) == 0:
        return
    pair, where = torch.unique(hs * n + rs, return_inverse=True)  # each (head, row) once, whatever its kinds
    probs = am.row_probs(lz, pair // n, pair % n, ka)  # (pairs, m): the candidates' rows only
    for j, i in enumerate(live):
        sel = kk == j
        if not bool(sel.any()):
            continue
        h, r = hs[sel], rs[sel]
        p = probs[where[sel]]  # (k, m), a copy
        keys = am.candidate_keys(am.KINDS[i], p.clone() if am.KINDS[i] == "weight" else p, r, h, pairs, zs)
        w = p.gather(1, keys[:, None])[:, 0]
        floors[l, i] = _push([(h, r, keys, w, v[j, h, r])], l, am.KINDS[i], heaps, top_k, seg_id, offer, H)


def _push(cands, l, kind, heaps, top_k, seg_id, offer, H):
    """Offer one layer's candidates (a list of _row_candidates / top_weights results) to the heads' heaps, in the
    order they came, but only those at or above each head's k-th best score: one below it would be pushed out by
    k better ones whatever the order, so the heaps end exactly as when offering every one in turn (ties
    included). Returns the heaps' floors (H,) after."""
    import torch

    cands = [c for c in cands if c is not None]
    if cands:
        hs, qs, ks, ws, scores = (torch.cat(parts) for parts in zip(*cands))
        hn, sn = hs.numpy(), scores.double().numpy()
        order = np.lexsort((-sn, hn))  # by head, then score, the largest first
        first = np.searchsorted(hn[order], np.arange(H))  # each head's first place in `order`
        count = np.bincount(hn, minlength=H)
        kth = np.where(count >= top_k, sn[order[np.minimum(first + top_k - 1, len(order) - 1)]], -np.inf)
        keep = np.nonzero(sn >= kth[hn])[0]  # below a head's k-th best: pushed out whatever the order
        for h, q, k, w, score in zip(hn[keep].tolist(), qs.numpy()[keep].tolist(), ks.numpy()[keep].tolist(),
                                     ws.numpy()[keep].tolist(), scores.numpy()[keep].tolist()):
            offer((l, h, kind), score, (seg_id, q, k, w, kind, score))
    return torch.tensor([heaps[(l, h, kind)].floor() for h in range(H)])
