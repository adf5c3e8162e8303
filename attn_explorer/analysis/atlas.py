"""The head atlas: what every head of a model does over a whole corpus, in one record.

For every head, corpus-wide metrics (each a mean over the query rows of every document, tokens weighted
alike) and its top (query, key) examples, kept in a bounded heap per head and per metric:

- entropy: mean row entropy, in bits;
- sink: mean share of a row's weight on the document's first token and on special tokens;
- distance: mean attention distance Σ_j α_ij·|i − j|, in tokens;
- prev_token: mean weight on the previous token (rows with one);
- duplicate: mean weight on earlier copies of the query's own token (rows whose token occurred before);
- induction: mean weight on the token after an earlier copy of the query's token (rows where one exists);
- copy: how much the head's OV circuit raises the logit of the token it attends to (analysis.atlas_math).

The Atlas holds NumPy only: it is saved as one .npz and opens again without the model.
`suggest_roles` turns the metrics into labels with stated thresholds; analysis.match pairs two atlases' heads.
"""
from __future__ import annotations

import heapq
import os
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from attn_explorer.errors import UserError

METRICS = ("entropy", "sink", "distance", "prev_token", "duplicate", "induction", "copy")
METRIC_HELP = {
    "entropy": "mean row entropy (bits)",
    "sink": "share of weight on the first token and special tokens",
    "distance": "mean attention distance (tokens)",
    "prev_token": "mean weight on the previous token",
    "duplicate": "mean weight on earlier copies of the query's token",
    "induction": "mean weight on the token after an earlier copy of the query's token",
    "copy": "how far the head's OV output raises the attended token's logit (z-score among the vocabulary)",
    "retrieval": "share of needle tokens copied while this head attended most to them (Wu et al. 2024)",
}
EXAMPLE_KINDS = ("weight",) + METRICS  # what an example can be ranked by
WINDOW = 12  # tokens of context either side of the query and key in an example


@dataclass
class Example:
    """One top (query, key) pair of a head: where it is, its weight and the metric it ranked by, and a window of
    token strings around the query and the key (query_at / key_at: their indices in `tokens`)."""

    doc: int
    query: int
    key: int
    weight: float
    metric: str  # "weight" or a METRICS name
    tokens: list[str]
    query_at: int
    key_at: int
    score: float = float("nan")  # the value it ranked by (the weight itself for "weight")


@dataclass
class Atlas:
    """Every head's corpus-wide metrics and top examples (NumPy only; no model)."""

    model: str
    n_layers: int
    n_heads: int
    tokens: int
    documents: int
    metrics: dict[str, np.ndarray]  # name -> (L, H) float array
    examples: dict[tuple[int, int], list[Example]]
    notes: dict[str, str] = field(default_factory=dict)  # metric -> why it is NaN, or how it was measured
    complete: bool = True  # False: stopped before the end of the corpus
    # the text of every segment an example points at (Example.doc is its segment id), to open it again in the
    # One-head view (the model reads it as it did here: Example.query indexes its tokens), and where it came from
    texts: dict[int, str] = field(default_factory=dict)
    sources: dict[int, str] = field(default_factory=dict)  # segment id -> a file name or "document N"

    def metric(self, name: str) -> np.ndarray:
        if name not in self.metrics:
            raise UserError(f"the atlas has no metric {name!r}: it has {', '.join(self.metrics)}")
        return self.metrics[name]

    def head_examples(self, layer: int, head: int, metric: str | None = None) -> list[Example]:
        """A head's examples, best first; metric: only those ranked by it ("weight" or a METRICS name)."""
        ex = self.examples.get((int(layer), int(head)), [])
        if metric is not None:
            ex = [e for e in ex if e.metric == metric]
        return sorted(ex, key=lambda e: (e.metric, -_rank_value(e)))

    def ranked(self, name: str) -> list[tuple[int, int, float]]:
        """Heads by a metric, highest first (NaNs last): (layer, head, value)."""
        m = self.metric(name)
        flat = np.where(np.isnan(m), -np.inf, m).ravel()
        order = np.argsort(-flat, kind="stable")
        return [(int(i // self.n_heads), int(i % self.n_heads), float(m.ravel()[i])) for i in order]

    def vectors(self, names: Iterable[str] | None = None) -> tuple[list[str], np.ndarray]:
        """(names, (L·H, len(names))) the heads' metric vectors, rows in layer-major order; metrics that are NaN
        for every head are left out."""
        names = [n for n in (names or self.metrics) if not np.all(np.isnan(self.metric(n)))]
        if not names:
            return [], np.zeros((self.n_layers * self.n_heads, 0))
        return names, np.stack([self.metric(n).ravel() for n in names], axis=1).astype(np.float64)

    # ---- one .npz -------------------------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {
            "atlas_version": np.array(1), "model": np.array(self.model),
            "shape": np.array([self.n_layers, self.n_heads], dtype=np.int64),
            "tokens": np.array(self.tokens, dtype=np.int64), "documents": np.array(self.documents, dtype=np.int64),
            "complete": np.array(bool(self.complete)),
            "seg_ids": np.array(sorted(self.texts), dtype=np.int64),
            "seg_texts": np.array([self.texts[i] for i in sorted(self.texts)], dtype=str),
            "seg_sources": np.array([self.sources.get(i, "") for i in sorted(self.texts)], dtype=str),
            "note_keys": np.array(list(self.notes), dtype=str),
            "note_values": np.array(list(self.notes.values()), dtype=str),
        }
        for name, v in self.metrics.items():
            out[f"metric_{name}"] = np.asarray(v, dtype=np.float64)
        rows = [(lh, e) for lh, exs in sorted(self.examples.items()) for e in exs]
        ints = np.array([[l, h, e.doc, e.query, e.key, e.query_at, e.key_at, len(e.tokens)] for (l, h), e in rows],
                        dtype=np.int64).reshape(-1, 8)
        out["ex_int"] = ints  # layer, head, doc, query, key, query_at, key_at, window length
        out["ex_weight"] = np.array([e.weight for _, e in rows], dtype=np.float64)
        out["ex_score"] = np.array([e.score for _, e in rows], dtype=np.float64)
        out["ex_metric"] = np.array([e.metric for _, e in rows], dtype=str)
        out["ex_tokens"] = np.array([t for _, e in rows for t in e.tokens], dtype=str)
        return out

    def save(self, path) -> None:
        """Write the atlas as one .npz (metric_<name> (L, H) arrays, the examples, the metadata), atomically."""
        from attn_explorer.files import atomic_write

        arrays = self.arrays()

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, **arrays)

        atomic_write(path, write)

    @classmethod
    def load(cls, path) -> "Atlas":
        """An atlas saved by `save`, without the model. A missing or broken file is one UserError line."""
        p = os.fspath(path)
        if not os.path.isfile(p):
            raise UserError(f"no atlas file at {p}")
        try:
            with np.load(p, allow_pickle=False) as z:
                d = {k: z[k] for k in z.files}
        except Exception as e:  # a truncated zip, not an npz, unreadable
            raise UserError(f"{os.path.basename(p)} is not a readable .npz ({type(e).__name__})") from None
        if "atlas_version" not in d:
            raise UserError(f"{os.path.basename(p)} is not an atlas (saved by `atlas` or the Atlas page)")
        try:
            L, H = (int(x) for x in d["shape"])
            metrics = {k[len("metric_"):]: np.asarray(v, dtype=np.float64) for k, v in d.items()
                       if k.startswith("metric_")}
            for k, v in metrics.items():
                if v.shape != (L, H):
                    raise ValueError(f"metric_{k} is shaped {v.shape}, not ({L}, {H})")
            examples: dict[tuple[int, int], list[Example]] = {}
            toks = [str(t) for t in d["ex_tokens"]]
            at = 0
            for row, w, s, m in zip(d["ex_int"], d["ex_weight"], d["ex_score"], d["ex_metric"]):
                l, h, doc, q, k, qa, ka, n = (int(x) for x in row)
                if not (0 <= l < L and 0 <= h < H) or at + n > len(toks):
                    raise ValueError("an example lies outside the atlas")
                examples.setdefault((l, h), []).append(Example(doc, q, k, float(w), str(m), toks[at:at + n], qa, ka,
                                                               float(s)))
                at += n
            notes = dict(zip((str(k) for k in d["note_keys"]), (str(v) for v in d["note_values"])))
            return cls(model=str(d["model"]), n_layers=L, n_heads=H, tokens=int(d["tokens"]),
                       documents=int(d["documents"]), metrics=metrics, examples=examples, notes=notes,
                       complete=bool(d["complete"]),
                       texts={int(i): str(t) for i, t in zip(d["seg_ids"], d["seg_texts"])},
                       sources={int(i): str(t) for i, t in zip(d["seg_ids"], d["seg_sources"])})
        except (KeyError, ValueError, TypeError) as e:
            raise UserError(f"{os.path.basename(p)} is a damaged atlas: {e}") from None


def _rank_value(e: Example) -> float:
    return e.weight if e.metric == "weight" or np.isnan(e.score) else e.score


# ---- roles ----------------------------------------------------------------------------------------------------
# A head gets a role when its metric reaches the threshold (the metric's own scale: a share of weight, or for
# retrieval the share of needle tokens). Stated on the page and in the CLI's summary.
ROLE_THRESHOLDS = {
    "previous-token": ("prev_token", 0.4),  # ≥ 40% of each row's weight on the previous token, on average
    "induction": ("induction", 0.3),  # ≥ 30% on the token after an earlier copy of the current one
    "sink": ("sink", 0.8),  # ≥ 80% on the first token and special tokens
    "duplicate": ("duplicate", 0.3),  # ≥ 30% on earlier copies of the current token
    "retrieval": ("retrieval", 0.1),  # Wu et al. 2024's threshold: copies ≥ 10% of needle tokens
}


def role_text() -> str:
    """The thresholds in words, for the page and the CLI."""
    return "; ".join(f"{role}: {metric} ≥ {t:g}" for role, (metric, t) in ROLE_THRESHOLDS.items())


def suggest_roles(atlas: Atlas) -> dict[tuple[int, int], list[str]]:
    """(layer, head) -> the roles whose metric reaches its threshold (ROLE_THRESHOLDS), in ROLE_THRESHOLDS' order.
    Heads with no role are left out. Retrieval is only suggested when the atlas has a retrieval metric."""
    out: dict[tuple[int, int], list[str]] = {}
    for role, (name, threshold) in ROLE_THRESHOLDS.items():
        m = atlas.metrics.get(name)
        if m is None:
            continue
        for l, h in zip(*np.nonzero(np.nan_to_num(np.asarray(m, dtype=np.float64), nan=-np.inf) >= threshold)):
            out.setdefault((int(l), int(h)), []).append(role)
    return {k: out[k] for k in sorted(out)}


class TopK:
    """The k largest (score, item) offered, in a heap: memory bounded whatever is offered."""

    def __init__(self, k: int):
        self.k, self.heap, self.n = int(k), [], 0

    def floor(self) -> float:
        return self.heap[0][0] if len(self.heap) >= self.k else -np.inf

    def offer(self, score: float, item) -> tuple[bool, object]:
        """(kept, the item it pushed out or None)."""
        self.n += 1
        entry = (float(score), self.n, item)
        if len(self.heap) < self.k:
            heapq.heappush(self.heap, entry)
            return True, None
        if entry[0] > self.heap[0][0]:
            return True, heapq.heapreplace(self.heap, entry)[2]
        return False, None

    def best(self) -> list:
        return [item for _, _, item in sorted(self.heap, key=lambda e: (-e[0], e[1]))]
