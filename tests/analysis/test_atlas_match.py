"""Matching two atlases' heads (analysis.match): an atlas against a permuted copy of itself gets the permutation
back; the fallback Hungarian method agrees with scipy's; too few shared metrics is one line."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.analysis import match
from attn_explorer.analysis.atlas import METRICS, Atlas
from attn_explorer.errors import UserError


def _atlas(L=4, H=6, seed=0, names=METRICS):
    rng = np.random.default_rng(seed)
    return Atlas("a", L, H, 100, 3, {k: rng.normal(size=(L, H)) * (i + 1) + i for i, k in enumerate(names)}, {})


@pytest.mark.parametrize("use_scipy", [True, False])
def test_a_permuted_atlas_is_matched_back(use_scipy, monkeypatch):
    if not use_scipy:
        monkeypatch.setattr(match, "assignment", match.hungarian)
    a = _atlas()
    L, H = a.n_layers, a.n_heads
    perm = np.random.default_rng(1).permutation(L * H)  # head perm[i] of b is head i of a
    b = Atlas("b", L, H, 100, 3, {}, {})
    for k, v in a.metrics.items():
        flat = np.empty(L * H)
        flat[perm] = v.ravel()
        b.metrics[k] = flat.reshape(L, H)
    pairs = match.match_heads(a, b)
    assert len(pairs) == L * H
    for la, ha, lb, hb, sim in pairs:
        assert lb * H + hb == perm[la * H + ha] and sim == pytest.approx(1.0)


def test_unequal_models_pair_every_head_of_the_smaller():
    a, b = _atlas(2, 3, seed=0), _atlas(3, 4, seed=2)
    pairs = match.match_heads(a, b)
    assert len(pairs) == 6 and len({(p[2], p[3]) for p in pairs}) == 6
    assert all(-1 - 1e-9 <= p[4] <= 1 + 1e-9 for p in pairs)
    assert [p[4] for p in pairs] == sorted((p[4] for p in pairs), reverse=True)


def test_metrics_nan_in_either_are_left_out():
    a, b = _atlas(), _atlas(seed=3)
    b.metrics["copy"] = np.full((4, 6), np.nan)  # an encoder: no copy score
    assert "copy" not in match.shared_metrics(a, b)
    assert len(match.match_heads(a, b)) == 24


def test_too_few_shared_metrics_is_one_line():
    a, b = _atlas(names=("entropy", "sink")), _atlas(names=("sink", "copy"))
    with pytest.raises(UserError, match="at least two metrics"):
        match.match_heads(a, b)


def test_hungarian_agrees_with_scipy():
    scipy = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (5, 5), (7, 4), (3, 9), (30, 30)]:
        for _ in range(10):
            s = rng.normal(size=shape)
            r, c = match.hungarian(s)
            r2, c2 = scipy.linear_sum_assignment(s, maximize=True)
            assert len(r) == min(shape) and len(set(c.tolist())) == len(c)
            assert s[r, c].sum() == pytest.approx(s[r2, c2].sum())
