"""Lesson "inside-a-head": one query token in one head of the loaded model, step by step.

The numbers come from `api.probe.head_trace` (one forward pass, run as the explorer runs it; the GUI
reaches it through `session.lessons.head_trace`). This module only arranges them for a learner: the
keys with the largest weights first (a long input would make a table nobody can read), the rest in
one summary line, and the steps from dot product to weighted sum.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOP_KEYS = 12  # rows shown; the others are summed in one line


@dataclass
class KeyRow:
    index: int  # token index of the key
    token: str
    logit: float  # q · k
    scaled: float  # q · k × scale
    exp: float  # exp(scaled − the largest scaled score)
    weight: float  # the model's own probability


@dataclass
class TraceTable:
    rows: list[KeyRow]  # the top keys, largest weight first
    rest_count: int  # keys not listed (that the query may look at)
    rest_weight: float  # their total weight
    rest_exp: float  # their total exp
    hidden_count: int  # keys a causal model hides from this query (weight 0)
    shift: float  # the largest scaled score, subtracted before exp (softmax does not change)
    exp_sum: float  # sum of exp over every allowed key
    weight_sum: float  # sum of the model's weights (1 up to rounding)
    softmax_gap: float  # largest |exp / exp_sum − model weight|: how closely these steps redo the model's


def trace_table(trace, top: int = TOP_KEYS) -> TraceTable:
    """The trace's keys sorted by weight, the first `top` as rows. `trace` is an api.probe.HeadTrace."""
    allowed = np.asarray(trace.allowed, dtype=bool)
    scaled = np.asarray(trace.logits, dtype=np.float64) * trace.scale
    shift = float(scaled[allowed].max()) if allowed.any() else 0.0
    exps = np.where(allowed, np.exp(np.where(allowed, scaled - shift, 0.0)), 0.0)
    exp_sum = float(exps.sum())
    probs = np.asarray(trace.probs, dtype=np.float64)
    idx = np.flatnonzero(allowed)
    order = idx[np.argsort(-probs[idx], kind="stable")]
    shown, rest = order[:top], order[top:]
    rows = [KeyRow(int(j), trace.tokens[j], float(trace.logits[j]), float(scaled[j]), float(exps[j]),
                   float(probs[j])) for j in shown]
    gap = float(np.abs(exps / exp_sum - probs).max()) if exp_sum > 0 else 0.0
    return TraceTable(rows=rows, rest_count=len(rest), rest_weight=float(probs[rest].sum()),
                      rest_exp=float(exps[rest].sum()), hidden_count=int((~allowed).sum()), shift=shift,
                      exp_sum=exp_sum, weight_sum=float(probs.sum()), softmax_gap=gap)
