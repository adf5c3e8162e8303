"""What the Atlas page may call: the corpus it reads, the atlas build (streamed, with progress and stop), save
and open, the heads' 2-D picture, a second model's atlas, the match, and one short prompt's maps of a head.

Every job returns plain NumPy and Python values (`analysis.atlas.Atlas` is NumPy only). Jobs that use the
session's model take it first (uses_model=True); a second model is loaded inside its own job by the session's
loader and kept in a `SecondModel` holder, which only worker threads touch, so two models can be in memory
at once (the session itself holds one).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attn_explorer.analysis.atlas import (EXAMPLE_KINDS, METRIC_HELP, METRICS, ROLE_THRESHOLDS, Atlas, Example,
                                          role_text, suggest_roles)
from attn_explorer.analysis.corpus import umap_available
from attn_explorer.errors import UserError
from attn_explorer.files import read_text_file

__all__ = ["Atlas", "Documents", "EXAMPLE_KINDS", "Example", "METRICS", "METRIC_HELP", "PromptMap", "ROLE_THRESHOLDS",
           "SecondModel", "TOP_K", "atlas_job", "bundled_corpus", "load_atlas_job", "match_job", "project_job",
           "prompt_map_job", "read_documents", "role_text", "save_atlas_job", "second_atlas_job",
           "second_prompt_map_job", "suggest_roles", "umap_available"]

MAX_DOCUMENTS = 20000
TOP_K = 8  # examples kept per head and per ranking
PROMPT_TOKENS = 64  # the "same prompt, two models" maps: at most this many tokens


@dataclass
class Documents:
    """A corpus as the atlas reads it: the texts, each one's name ("a.txt", "a.txt:3"), and where they came from."""

    texts: list[str]
    names: list[str]
    source: str  # "the bundled corpus", "folder books/", "2 files"

    def __len__(self) -> int:
        return len(self.texts)


def bundled_corpus() -> Path | None:
    """The corpus that ships with the app (resources/corpus), or None where this installation has none."""
    from attn_explorer.resources import resource_path

    d = resource_path("corpus")
    return d if d.is_dir() and any(d.glob("*.txt")) else None


def read_documents(paths: list[str | os.PathLike], per_line: bool = False, source: str | None = None) -> Documents:
    """Text files (a folder: its .txt files, sorted) as documents: one a file, or with per_line one a non-blank
    line. A missing, unreadable or empty corpus is one UserError line."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.rglob("*.txt") if q.is_file())
            if not found:
                raise UserError(f"the folder {p} has no .txt files")
            files += found
        else:
            files.append(p)
    if not files:
        raise UserError("no text files were given")
    texts, names = [], []
    for f in files:
        text = read_text_file(f)
        if per_line:
            for i, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    texts.append(line.strip())
                    names.append(f"{f.name}:{i}")
        elif text.strip():
            texts.append(text)
            names.append(f.name)
        if len(texts) > MAX_DOCUMENTS:
            raise UserError(f"the corpus has more than {MAX_DOCUMENTS:,} documents; give fewer (or whole files)")
    if not texts:
        raise UserError("the corpus has no text")
    if source is None:
        source = (f"folder {Path(paths[0]).name}/" if len(paths) == 1 and Path(paths[0]).is_dir()
                  else files[0].name if len(files) == 1 else f"{len(files)} files")
    return Documents(texts, names, source)


# ---------------------------------------------------------------------------------------------- the build
def _build(model, documents: Documents, top_k: int, max_tokens: int | None, progress) -> Atlas:
    from attn_explorer.analysis.atlas_build import build_atlas

    def step(done: int, total: int) -> None:
        progress(done / max(1, total), f"{done:,} / {total:,} tokens")  # raises Cancelled once the job is quit

    named = list(zip(documents.names, documents.texts))  # (name, text): each example says where it came from
    return build_atlas(model, named, top_k=top_k, max_tokens=max_tokens, progress=step)


def atlas_job(model, documents: Documents, top_k: int, max_tokens: int | None, progress=None) -> Atlas:
    """The session model's atlas of `documents`; progress(fraction, "done / total tokens"). Quitting the worker
    (the lane's cancel) ends it at the next chunk, and nothing arrives."""
    return _build(model, documents, top_k, max_tokens, progress or (lambda *_: None))


@dataclass
class SecondModel:
    """A second model, loaded in a worker by the session's loader, kept for the "same prompt" maps. Only jobs
    read or write it."""

    src: str = ""
    model: object = None
    info: object = None
    note: list[str] = field(default_factory=list)

    def ensure(self, loader, src: str, device: str):
        if self.model is None or self.src != src:
            self.model = self.info = None  # the old one goes before the new one is read
            loaded = loader(src, device=device)
            self.src, self.model, self.info = src, loaded.model, loaded.info
        return self.model


def second_atlas_job(holder: SecondModel, loader, src: str, device: str, documents: Documents, top_k: int,
                     max_tokens: int | None, progress=None) -> Atlas:
    """Load `src` (into `holder`) and build its atlas of the same documents."""
    progress = progress or (lambda *_: None)
    progress(0.0, f"loading {src}")
    model = holder.ensure(loader, src, device)
    if getattr(holder.info, "modality", "text") != "text":
        raise UserError(f"{src} reads images; the atlas takes text")
    return _build(model, documents, top_k, max_tokens, progress)


def save_atlas_job(atlas: Atlas, path: str) -> str:
    if not str(path).lower().endswith(".npz"):
        path = f"{path}.npz"
    try:
        atlas.save(path)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    return str(path)


def load_atlas_job(path: str) -> Atlas:
    return Atlas.load(path)


def match_job(a: Atlas, b: Atlas) -> list[tuple[int, int, int, int, float]]:
    from attn_explorer.analysis.match import match_heads

    return match_heads(a, b)


# ---------------------------------------------------------------------------------------------- the picture
@dataclass
class Projection:
    """Every head in 2-D: xy (L·H, 2) in layer-major order; explained: PCA's share of variance per axis (None
    for UMAP); the metrics it used."""

    xy: np.ndarray
    method: str
    explained: tuple[float, float] | None
    metrics: list[str]


def project_job(atlas: Atlas, method: str = "pca", seed: int = 0) -> Projection:
    """PCA (NumPy SVD) or UMAP of the heads' metric vectors, each metric standardised over the heads (metrics
    NaN for every head left out; a NaN left is the metric's mean)."""
    names, X = atlas.vectors()
    if X.shape[1] < 2 or X.shape[0] < 3:
        raise UserError("the picture needs at least 3 heads and 2 measured metrics")
    X = np.where(np.isnan(X), np.nanmean(X, axis=0), X)
    sd = X.std(axis=0)
    Z = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    if method == "umap":
        if not umap_available():
            raise UserError("UMAP needs umap-learn (pip install umap-learn); PCA works without it")
        import umap

        xy = umap.UMAP(n_components=2, random_state=seed, n_neighbors=min(15, len(Z) - 1)).fit_transform(Z)
        return Projection(np.asarray(xy, dtype=np.float64), "umap", None, names)
    if method != "pca":
        raise UserError(f"method must be pca or umap, got {method!r}")
    U, S, _ = np.linalg.svd(Z, full_matrices=False)
    var = S ** 2
    share = var / var.sum() if var.sum() > 0 else np.zeros_like(var)
    xy = U[:, :2] * S[:2]
    if xy.shape[1] < 2:
        xy = np.pad(xy, ((0, 0), (0, 2 - xy.shape[1])))
    return Projection(xy, "pca", (float(share[0]), float(share[1]) if len(share) > 1 else 0.0), names)


# ---------------------------------------------------------------------------------------------- same prompt
@dataclass
class PromptMap:
    """One head's map for a short prompt: its tokens and the (n, n) weights, and which model made it."""

    model: str
    layer: int
    head: int
    tokens: list[str]
    weights: np.ndarray


def _prompt_map(model, text: str, layer: int, head: int) -> PromptMap:
    if not text.strip():
        raise UserError("type a short prompt first")
    r = model.run(text, max_tokens=PROMPT_TOKENS, lazy=False)
    L, H = r.attentions.shape[:2]
    if not (0 <= layer < L and 0 <= head < H):
        raise UserError(f"L{layer} H{head} is not a head of {model.info.name} ({L} layers × {H} heads)")
    return PromptMap(model.info.name, layer, head, list(r.tokens), np.asarray(r.attentions[layer, head]))


def prompt_map_job(model, text: str, layer: int, head: int) -> PromptMap:
    """The session model's map of one head for `text` (its first PROMPT_TOKENS tokens)."""
    return _prompt_map(model, text, layer, head)


def second_prompt_map_job(holder: SecondModel, text: str, layer: int, head: int) -> PromptMap:
    """The second model's map of one head, where it is loaded in `holder`."""
    if holder.model is None:
        raise UserError("the second model is not loaded: its atlas was opened from a file")
    return _prompt_map(holder.model, text, layer, head)
