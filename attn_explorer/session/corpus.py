"""What the Corpus page may call: the gathering job (streamed, with progress and stop) and the embedding.

`gather_job` runs in a worker lane with the model (uses_model=True): it yields (done, total) after each
sentence and returns the `analysis.corpus.Corpus` (plain NumPy). `embedding_job` needs no model.
"""
from __future__ import annotations

from attn_explorer.analysis.corpus import (ALIGN_NOTE, Corpus, Embedding, HeadPoints, joint_embedding, parse_heads,
                                           read_sentences, umap_available)
from attn_explorer.analysis.corpus import gather as _gather

__all__ = ["ALIGN_NOTE", "Corpus", "Embedding", "HeadPoints", "embedding_job", "gather_job", "parse_heads",
           "read_sentences", "umap_available"]


def gather_job(model, sentences: list[str], heads: list[tuple[int, int]], max_points: int, dk_scale: float):
    """A generator job: (done, total) after each sentence, then returns the Corpus. Stopping the worker
    (the lane's cancel) ends it at the next sentence."""
    result = None
    for item in _gather(model, sentences, heads, max_points, dk_scale):
        if isinstance(item, Corpus):
            result = item
        else:
            yield item
    return result


def embedding_job(points: HeadPoints, method: str) -> Embedding:
    return joint_embedding(points, method)
