"""The variants on a model's own q, k, v, beside random ones of the same shape."""
from __future__ import annotations

import pytest
import torch

from attn_explorer.cost.estimate import PointCost, human_seconds, predict_seconds, remaining_seconds
from attn_explorer.cost.real import compare_on_qkv, window_for


def local_qkv(H=2, N=64, d=16, reach=3.0):
    """q, k whose scores fall off with distance |i − j|, as many trained heads do: local attention."""
    g = torch.Generator().manual_seed(0)
    pos = torch.arange(N, dtype=torch.float32)
    freqs = torch.linspace(0.05, 0.4, d // 2)
    angle = pos[:, None] * freqs[None, :]  # (N, d/2)
    feat = torch.cat([angle.cos(), angle.sin()], dim=-1) * reach  # q·k = reach² Σ cos(f (i − j))
    q = feat.expand(H, N, d).contiguous()
    return q, q.clone(), torch.randn(H, N, d, generator=g)


def test_window_is_closer_on_local_attention_than_on_random_vectors():
    q, k, v = local_qkv()
    rows = {r.impl: r for r in compare_on_qkv(q, k, v, window=16, repeats=1)}
    assert rows["naive"].rel_error is None and rows["naive"].random_rel_error is None
    assert rows["chunked"].rel_error < 1e-5 and rows["sdpa"].rel_error < 1e-5
    assert rows["window"].rel_error < rows["window"].random_rel_error / 2
    assert all(r.ms_min <= r.ms <= r.ms_max for r in rows.values())


def test_a_window_that_covers_the_input_is_replaced_by_a_quarter_of_it():
    assert window_for(14, 128) == 3 and window_for(200, 128) == 128
    q, k, v = local_qkv(N=16)
    rows = {r.impl: r for r in compare_on_qkv(q, k, v, impls=["naive", "window"], window=128, repeats=1)}
    assert rows["window"].rel_error > 1e-3  # not the exact answer a 128-token window would give


def test_bad_shapes_say_so():
    with pytest.raises(ValueError, match=r"shaped \(H, N, d_k\)"):
        compare_on_qkv(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8))


def test_the_estimate_scales_each_variants_last_point_by_its_growth():
    seen = {"naive": PointCost(n=1024, warm_s=0.2, run_s=0.1), "linear": PointCost(n=1024, warm_s=0.02, run_s=0.01)}
    growth = {"naive": 2.0, "linear": 1.0}
    assert predict_seconds(seen["naive"], 2048, 2.0, repeats=3) == pytest.approx(4 * (0.2 + 3 * 0.1))
    assert predict_seconds(seen["naive"], 2048, 2.0, repeats=3, time_budget_s=0.5) == pytest.approx(0.8 + 0.5 + 0.4)
    left = remaining_seconds(seen, [(2048, "naive"), (2048, "linear")], growth, repeats=3)
    assert left == pytest.approx(4 * 0.5 + 2 * 0.05)
    assert remaining_seconds(seen, [(2048, "window")], growth | {"window": 1.0}, repeats=3) is None
    assert human_seconds(42.4) == "about 42 s" and human_seconds(130) == "about 2 min 10 s"
    assert human_seconds(None) == ""
