"""What the logit-lens, contribution-graph and why-this-head pages may call from the analysis floor.

Job functions run in a worker through `SessionState.submit(job, ..., key="lens-...")` (each takes the model
first; those with `progress` report it and stop when their lane is cancelled); `trace` and `condensed` are
pure functions on drawing-sized NumPy data that a page may call in the GUI thread.
"""
from __future__ import annotations

from attn_explorer.analysis.flow import Edge, FlowGraph, trace
from attn_explorer.analysis.lens import CONVENTION, NORMS, OWN, LogitAttribution, LogitLens
from attn_explorer.analysis.why import CONVENTION as WHY_CONVENTION, WhyMatrix

__all__ = ["CONVENTION", "NORMS", "OWN", "WHY_CONVENTION", "Edge", "FlowGraph", "LogitAttribution", "LogitLens",
           "WhyMatrix", "attribution_job", "flow_job", "head_tokens_job", "lens_job", "trace", "why_job"]


def _decoder_kw(run_kw: dict) -> dict:
    """The window's run options that a decoder analysis takes (d_k and the token cut)."""
    return {k: v for k, v in run_kw.items() if k in ("dk_scale", "dk_layers", "max_tokens")}


def lens_job(model, x, run_kw: dict, k: int = 5, norm: str = "frozen", progress=None) -> LogitLens:
    """The logit lens of text x (every layer × position, top-k tokens)."""
    from attn_explorer.analysis.lens import logit_lens

    return logit_lens(model, x, _decoder_kw(run_kw), k=k, norm=norm, progress=progress)


def attribution_job(model, x, run_kw: dict, position: int, target: str | None) -> LogitAttribution:
    """Direct logit attribution of `target` (None: the model's own next token) at `position`."""
    from attn_explorer.analysis.lens import logit_attribution

    return logit_attribution(model, x, _decoder_kw(run_kw), position=position, target=target or None)


def flow_job(model, x, run_kw: dict, progress=None) -> FlowGraph:
    """Every edge's share for text x (the contribution graph, before tracing)."""
    from attn_explorer.analysis.flow import contribution_graph

    return contribution_graph(model, x, _decoder_kw(run_kw), progress=progress)


def head_tokens_job(model, x, run_kw: dict, layer: int, head: int, position: int, k: int = 8):
    """(promoted, suppressed): [(token, logit)] of one head's direct output at `position`."""
    from attn_explorer.analysis.lens import head_tokens

    return head_tokens(model, x, _decoder_kw(run_kw), layer, head, position, k)


def why_job(model, x, run_kw: dict, layer: int, head: int, query: int, key: int, progress=None) -> WhyMatrix:
    """The writer × writer split of one head's logit for (query, key)."""
    from attn_explorer.analysis.why import why_matrix

    return why_matrix(model, x, _decoder_kw(run_kw), layer, head, query, key, progress=progress)
