"""A corpus view: what a head does over many sentences, not one.

Two things are gathered while the sentences stream through the model, one forward pass each:

- for the heads you choose, the query and key vectors of their tokens (after RoPE, as the head uses
  them), subsampled to a fixed number of tokens per head, so memory stays bounded whatever the corpus;
- for every head, the head overview's statistics (analysis.stats) of every sentence, and how strongly the
  head "fires" in it: the largest weight it puts from one real token on another (special tokens and a
  token's own position left out).

`joint_embedding` then places a head's queries and keys in one 2-D picture (AttentionViz, Yeh et al.
2023): both are first scaled so that their mean norms agree (q·c and k/c leave q·k as it was), then the
keys are translated so that their mean equals the queries' mean (a translation t of every key adds q·t to
all of one query's logits alike). Neither step changes any softmax. Then PCA of queries and keys
together (always), or UMAP when `umap-learn` is installed and asked for.

Everything here returns plain NumPy records; no model is kept in them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np

from attn_explorer.analysis.stats import STATISTICS, head_stats
from attn_explorer.errors import UserError
from attn_explorer.validate import existing_head

if TYPE_CHECKING:  # the model is api's (import-linter sees this arrow); torch is imported in the functions
    from attn_explorer.api.model import Model

MAX_POINTS = 4000  # tokens kept per chosen head (each gives a query and a key point)
MAX_SENTENCES = 20000


@dataclass
class HeadPoints:
    """One chosen head's subsampled tokens: their query and key vectors, and where each came from."""

    layer: int
    head: int
    q: np.ndarray  # float32 (P, d_k)
    k: np.ndarray  # float32 (P, d_k): the same P tokens' keys
    sentence: np.ndarray  # int32 (P,)
    position: np.ndarray  # int32 (P,) token index in its sentence
    token: list[str]  # (P,)
    special: np.ndarray  # bool (P,)


@dataclass
class Corpus:
    """What one pass over a corpus gathered."""

    model: str
    sentences: list[str]  # the sentences run, in order (blank lines dropped)
    tokens: list[list[str]]  # each sentence's tokens
    stats: dict[str, np.ndarray]  # statistic -> float32 (S, L, H), per sentence
    fire: np.ndarray  # float32 (S, L, H): the largest weight from one real token to another
    heads: list[HeadPoints] = field(default_factory=list)
    distance_unit: str = "tokens"
    tokens_seen: int = 0  # tokens of every sentence together
    complete: bool = True  # False: stopped before the end (the records cover the sentences run)

    @property
    def num_sentences(self) -> int:
        return len(self.sentences)

    def mean(self, name: str) -> np.ndarray:
        """(L, H): the statistic's mean over sentences."""
        return self._stat(name).mean(axis=0)

    def spread(self, name: str) -> np.ndarray:
        """(L, H): the statistic's standard deviation over sentences."""
        return self._stat(name).std(axis=0)

    def top_sentences(self, layer: int, head: int, k: int = 5) -> list[tuple[int, float]]:
        """The k sentences where this head fires most: (sentence index, its largest weight), best first."""
        f = self.fire[:, int(layer), int(head)]
        order = np.argsort(-f, kind="stable")[:k]
        return [(int(i), float(f[i])) for i in order]

    def points(self, layer: int, head: int) -> HeadPoints:
        for h in self.heads:
            if (h.layer, h.head) == (int(layer), int(head)):
                return h
        kept = ", ".join(f"L{h.layer} H{h.head}" for h in self.heads) or "none"
        raise UserError(f"L{layer} H{head} was not gathered (gathered: {kept})")

    def _stat(self, name: str) -> np.ndarray:
        if name not in self.stats:
            raise UserError(f"unknown statistic {name!r}: choose from {', '.join(STATISTICS)}")
        return self.stats[name]


def read_sentences(text: str, limit: int = MAX_SENTENCES) -> list[str]:
    """One sentence a line; blank lines are skipped. Refuses an empty corpus or one over `limit` lines."""
    lines = [ln.strip() for ln in text.splitlines()]
    sentences = [ln for ln in lines if ln]
    if not sentences:
        raise UserError("the corpus has no sentences: put one sentence on each line")
    if len(sentences) > limit:
        raise UserError(f"the corpus has {len(sentences):,} sentences; at most {limit:,} are taken at once")
    return sentences


def parse_heads(spec: str | None, layers: int, heads: int) -> list[tuple[int, int]]:
    """ "3:1,0:0" -> [(3, 1), (0, 0)]; None or "" -> [(last layer, 0)]. Each must exist."""
    if not spec:
        return [(layers - 1, 0)]
    out = []
    for part in spec.split(","):
        part = part.strip()
        try:
            l, h = (int(x) for x in part.split(":"))
        except ValueError:
            raise UserError(f"heads are written layer:head, comma-separated (like 3:1,0:0); got {part!r}") from None
        existing_head(l, h, layers, heads)
        if (l, h) not in out:
            out.append((l, h))
    return out


class _Reservoir:
    """A uniform sample of at most `size` tokens out of all seen (Vitter's algorithm R, seeded)."""

    def __init__(self, size: int, seed: int = 0):
        self.size, self.seen, self.kept = int(size), 0, 0
        self.rng = np.random.default_rng(seed)

    def offer(self, n: int) -> list[tuple[int, int]]:
        """For n new tokens: which of them to keep, as (token index, slot), slot -1 = append."""
        keep = []
        for i in range(n):
            if self.kept < self.size:
                keep.append((i, -1))
                self.kept += 1
            else:
                j = int(self.rng.integers(0, self.seen + i + 1))
                if j < self.size:
                    keep.append((i, j))
        self.seen += n
        return keep


def _fire(att: np.ndarray, special: np.ndarray) -> np.ndarray:
    """(L, H, N, N) -> (L, H): the largest weight from a real token to another real token."""
    real = ~np.asarray(special, dtype=bool)
    if real.sum() < 2:
        return np.zeros(att.shape[:2], dtype=np.float32)
    a = att[:, :, real][:, :, :, real].copy()
    idx = np.arange(a.shape[-1])
    a[:, :, idx, idx] = 0.0  # a token on itself does not count
    return a.max(axis=(-1, -2)).astype(np.float32)


def gather(model: Model, sentences: Iterable[str], heads: list[tuple[int, int]], max_points: int = MAX_POINTS,
           dk_scale: float = 1.0, should_stop: Callable[[], bool] | None = None) -> Iterator[tuple[int, int] | Corpus]:
    """Run every sentence through `model` (an api Model of text), one forward pass each; yields (done, total)
    after each sentence and finally the Corpus. `should_stop()` returning True ends early: the Corpus then
    covers the sentences run and says it is incomplete."""
    info = model.info
    if info.modality != "text":
        raise UserError(f"{info.name} reads images; the corpus view takes sentences of text")
    if info.encoder_decoder:
        raise UserError(f"{info.name} is an encoder-decoder; the corpus view takes encoders and decoders")
    from attn_explorer.api.hooks import heads_first

    sentences = list(sentences)
    total = len(sentences)
    for l, h in heads:
        existing_head(l, h, info.num_layers, info.num_heads)
    layers = sorted({l for l, _ in heads})
    pools = {hd: _Reservoir(max_points, seed=hd[0] * 1009 + hd[1]) for hd in heads}
    store: dict[tuple[int, int], dict[str, list]] = {hd: {"q": [], "k": [], "s": [], "p": [], "t": [], "sp": []}
                                                     for hd in heads}
    stats: dict[str, list] = {name: [] for name in STATISTICS}
    fire, toks, kept_sentences = [], [], []
    unit, seen = "tokens", 0
    dims: dict[tuple[int, int], int] = {}
    for si, sentence in enumerate(sentences):
        if should_stop is not None and should_stop():
            break
        prep = model.prepare(sentence, max_tokens=None)
        t = model.trace(prep, names=[f"blocks.{l}.attn.hook_{p}" for l in layers for p in "qk"], dk_scale=dk_scale,
                        attentions=True)
        att = t.out.attentions[0].float().cpu().numpy()  # (L, H, N, N), small: one sentence
        special = np.asarray(prep.special, dtype=bool)
        s = head_stats(att, special)
        unit = s.distance_unit
        for name in STATISTICS:
            stats[name].append(s.get(name).astype(np.float32))
        fire.append(_fire(att, special))
        n = len(prep.tokens)
        for (l, h), pool in pools.items():
            picks = pool.offer(n)
            if not picks:
                continue
            q = heads_first(t.cache[f"blocks.{l}.attn.hook_q"], info.num_heads)[0, h].float().cpu().numpy()  # (N, d_k)
            k = heads_first(t.cache[f"blocks.{l}.attn.hook_k"], info.num_heads)[0, h].float().cpu().numpy()
            st = store[(l, h)]
            dims[(l, h)] = q.shape[-1]
            for i, slot in picks:
                row = (q[i], k[i], si, i, prep.tokens[i], bool(special[i]))
                if slot < 0:
                    for key, v in zip(("q", "k", "s", "p", "t", "sp"), row):
                        st[key].append(v)
                else:
                    for key, v in zip(("q", "k", "s", "p", "t", "sp"), row):
                        st[key][slot] = v
        toks.append(list(prep.tokens))
        kept_sentences.append(sentence)
        seen += n
        yield si + 1, total
    if not kept_sentences:
        raise UserError("stopped before the first sentence: nothing was gathered")
    L, H = info.num_layers, info.num_heads
    points = []
    for (l, h), st in store.items():
        d = dims.get((l, h), 1)
        points.append(HeadPoints(
            layer=l, head=h, q=np.asarray(st["q"], dtype=np.float32).reshape(len(st["q"]), d),
            k=np.asarray(st["k"], dtype=np.float32).reshape(len(st["k"]), d), sentence=np.asarray(st["s"], dtype=np.int32),
            position=np.asarray(st["p"], dtype=np.int32), token=list(st["t"]), special=np.asarray(st["sp"], dtype=bool)))
    yield Corpus(model=info.name, sentences=kept_sentences, tokens=toks,
                 stats={k: np.stack(v).reshape(-1, L, H) for k, v in stats.items()},
                 fire=np.stack(fire).reshape(-1, L, H), heads=points, distance_unit=unit, tokens_seen=seen,
                 complete=len(kept_sentences) == total)


def run_corpus(model: Model, sentences, heads, max_points: int = MAX_POINTS, dk_scale: float = 1.0,
               progress: Callable[[int, int], None] | None = None) -> Corpus:
    """gather() to the end: the Corpus (progress(done, total) after each sentence)."""
    for item in gather(model, sentences, heads, max_points, dk_scale):
        if isinstance(item, Corpus):
            return item
        if progress is not None:
            progress(*item)
    raise AssertionError("gather ended without a Corpus")  # pragma: no cover


@dataclass
class Embedding:
    """One head's queries and keys in one 2-D picture: the first P rows of xy are queries, the next P keys."""

    xy: np.ndarray  # float32 (2P, 2)
    method: str  # "pca" or "umap"
    explained: tuple[float, float] | None  # PCA: the share of variance along each axis
    note: str  # what was done to the keys, for the page and the file


def align_keys(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AttentionViz's alignment: queries times c and keys divided by c, c making their mean norms equal;
    then the keys translated so that their mean is the queries' mean. Neither step changes any query's
    softmax (q·k is kept by the first; the second adds q·t to all of one query's logits alike)."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    nq, nk = np.linalg.norm(q, axis=1).mean(), np.linalg.norm(k, axis=1).mean()
    c = np.sqrt(nk / nq) if nq > 0 and nk > 0 else 1.0
    q, k = q * c, k / c
    return q, k - k.mean(axis=0) + q.mean(axis=0)


ALIGN_NOTE = ("queries and keys scaled to the same mean norm, then the keys moved so that their mean is the "
              "queries' mean (AttentionViz); neither changes any attention weight")


def umap_available() -> bool:
    try:
        import umap  # noqa: F401
    except ImportError:
        return False
    return True


def joint_embedding(points: HeadPoints, method: str = "pca", seed: int = 0) -> Embedding:
    """Queries and keys of one head in 2-D (see the module's docstring). method: "pca", or "umap" (needs
    umap-learn; a clear line says so when it is missing)."""
    if method not in ("pca", "umap"):
        raise UserError(f"method must be pca or umap, got {method!r}")
    P = len(points.q)
    if P < 2:
        raise UserError(f"L{points.layer} H{points.head} has {P} token(s) gathered; the picture needs at least 2")
    q, k = align_keys(points.q, points.k)
    X = np.concatenate([q, k])
    if method == "umap":
        if not umap_available():
            raise UserError("UMAP needs umap-learn (pip install umap-learn); PCA works without it")
        import umap

        xy = umap.UMAP(n_components=2, random_state=seed).fit_transform(X)
        return Embedding(np.asarray(xy, dtype=np.float32), "umap", None, ALIGN_NOTE)
    Xc = X - X.mean(axis=0)
    _, sv, vt = np.linalg.svd(Xc, full_matrices=False)
    comps = vt[:2]
    xy = Xc @ comps.T
    if xy.shape[1] < 2:  # d_k of 1: a line
        xy = np.concatenate([xy, np.zeros((len(xy), 1))], axis=1)
    var = sv ** 2
    explained = tuple(float(v / var.sum()) if var.sum() > 0 else 0.0 for v in (list(var[:2]) + [0.0, 0.0])[:2])
    return Embedding(xy.astype(np.float32), "pca", explained, ALIGN_NOTE)


def corpus_arrays(c: Corpus, method: str = "pca") -> dict[str, np.ndarray]:
    """Everything a .npz holds: the statistics (S, L, H), the fire scores, per chosen head its tokens'
    q, k, their 2-D embedding and where they came from."""
    arrays: dict[str, np.ndarray] = {
        "model": np.array(c.model), "sentences": np.array(c.sentences), "fire": c.fire,
        "tokens_seen": np.array(c.tokens_seen), "complete": np.array(c.complete),
        "distance_unit": np.array(c.distance_unit), "embedding_note": np.array(ALIGN_NOTE),
        "heads": np.array([[h.layer, h.head] for h in c.heads], dtype=np.int32).reshape(-1, 2),
    }
    for name, v in c.stats.items():
        arrays[f"stat_{name}"] = v
    for h in c.heads:
        tag = f"L{h.layer}H{h.head}"
        arrays[f"{tag}_q"], arrays[f"{tag}_k"] = h.q, h.k
        arrays[f"{tag}_sentence"], arrays[f"{tag}_position"] = h.sentence, h.position
        arrays[f"{tag}_token"], arrays[f"{tag}_special"] = np.array(h.token), h.special
        if len(h.q) >= 2:
            arrays[f"{tag}_xy"] = joint_embedding(h, method).xy
    return arrays
