"""What the GUI's analysis pages may call from the analysis floor, so `gui/` never imports below `session/`.

Plain imports (import-linter sees every one). Two kinds of names:

- pure functions on drawing-sized data, which a page may call in the GUI thread (`findings`, `mismatch`,
  `special_share` of one head's map);
- job functions, which a page runs in a worker through `SessionState.submit(job, ..., key="analysis-<page>")`:
  anything over the whole (L, H, N, N) attention, and anything that needs a model.

Runs in lanes replace the old AnalysisSlot: a lane has newest-wins built in (session.runner).
"""
from __future__ import annotations

import numpy as np

from attn_explorer.analysis import ANALYSES
from attn_explorer.analysis.compare import attention_diff, mismatch, shape_text
from attn_explorer.analysis.norms import LayerNorms, model_norms, special_share
from attn_explorer.analysis.rollout import FUSIONS, rollout_layers
from attn_explorer.analysis.search import HeadScore, head_scores, preset_target, rank_heads
from attn_explorer.analysis.stats import HeadStats, findings, head_stats

__all__ = ["ANALYSES", "FUSIONS", "HeadScore", "HeadStats", "LayerNorms", "attention_diff", "compare_job",
           "findings", "head_stats", "head_stats_job", "load_and_run_job", "long_head_stats_job", "long_rollout_job",
           "mismatch", "norms_job", "rollout_job", "rollout_layers", "run_job", "search_job", "shape_text",
           "special_share"]

TOP = 10  # heads the search page lists


# ---- pure jobs (run with uses_model=False: the whole attention stack is too big for the GUI thread) -------

def head_stats_job(att, special, grid, patch_offset, patch_size) -> HeadStats:
    """Every statistic of every head (the overview page)."""
    return head_stats(att, special, grid, patch_offset, patch_size)


def rollout_job(att, fusion: str, discard_ratio: float) -> np.ndarray:
    """(L, N, N): the rollout through layers 0..l, for every l (the rollout page)."""
    return rollout_layers(att, fusion, discard_ratio)


def long_head_stats_job(r, grid, patch_offset, patch_size, progress=None) -> HeadStats:
    """The overview's statistics of a long input's result (r.is_lazy: no maps kept), in row tiles from each
    layer's q and k, reporting progress after every tile; a cancel stops it at the next one."""
    from attn_explorer.analysis.long import layers_of, tiled_head_stats  # torch: in the worker, not at window start
    from attn_explorer.session.jobs import configure_torch

    configure_torch()
    return tiled_head_stats(layers_of(r.lazy), r.special, grid, patch_offset, patch_size, progress=progress)


def long_rollout_job(r, query: int, fusion: str, discard_ratio: float, upto: int | None,
                     progress=None) -> np.ndarray:
    """(N,): row `query` of the rollout through layers 0..upto (all when None) of a long input's result,
    as vector-matrix products layer by layer, with progress; a cancel stops it at the next tile."""
    from attn_explorer.analysis.long import layers_of, rollout_row  # torch: in the worker, not at window start
    from attn_explorer.session.jobs import configure_torch

    configure_torch()
    return rollout_row(layers_of(r.lazy), query, fusion, discard_ratio, upto, progress=progress)


def search_job(att, special, tokens, pattern: str, query: str, key: str, offset: int, top: int = TOP):
    """(target, scores (L, H), the `top` best heads) for one pattern (the head-search page)."""
    n = att.shape[-1]
    if pattern == "offset":
        if offset == 0:
            target = preset_target("self", n)
        else:
            target = np.zeros((n, n), dtype=np.float32)
            i = np.arange(max(0, -offset), min(n, n - offset))
            target[i, i + offset] = 1
    else:
        target = preset_target(pattern, n, list(tokens), query, key)
    return target, head_scores(att, target), rank_heads(att, target, top)


def compare_job(a, b) -> np.ndarray:
    """B − A over every head (float32); a UserError says why when the shapes differ."""
    return attention_diff(a, b)


# ---- jobs that need a model (the first argument is the model) ---------------------------------------------

def norms_job(model, x, run_kw: dict, layers=None) -> LayerNorms:
    """Raw attention and value-weighted norms of `layers` (all when None) for input x."""
    return model_norms(model, x, layers, **run_kw)


def run_job(model, x, run_kw: dict):
    """model.run(x, **run_kw): the second input of a comparison (a RunResult)."""
    return model.run(x, **run_kw)


def load_job(src: str, device: str = "cpu", progress=None):
    """Load a second model for a comparison (an api Model, kept by the page as an opaque handle)."""
    from attn_explorer.api.load import load_model

    return load_model(src, device=device, progress=progress)


def load_and_run_job(src: str, device: str, x, run_kw: dict, progress=None):
    """(model, its RunResult for x): the second model of a comparison, loaded and run in one job."""
    model = load_job(src, device, progress)
    return model, model.run(x, **run_kw)
