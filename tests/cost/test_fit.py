"""Slopes fitted over the large-n range, and the one noise verdict the page and the CLI share."""
from __future__ import annotations

import pytest

from attn_explorer.cost.fit import fit_power_law, large_n_fit, noise_verdict, slopes

NS = [64, 128, 256, 512, 1024, 2048, 4096]


def records(impl: str, ms: list[float], runs: list[list[float]] | None = None) -> list[dict]:
    runs = runs or [[m] * 3 for m in ms]
    return [dict(n=n, impl=impl, status="ok", ms=m, ms_runs=r) for n, m, r in zip(NS, ms, runs)]


def test_power_law_fit_recovers_the_exponent():
    fit = fit_power_law(NS[:5], [3.0 * n**1.5 for n in NS[:5]])
    assert fit.p == pytest.approx(1.5) and fit.a == pytest.approx(3.0)
    assert fit_power_law([64], [1.0]) is None


def test_the_slope_skips_the_sizes_where_overhead_dominates():
    # 0.2 ms of fixed per-call overhead plus a linear part: the small sizes look flat
    ys = [0.2 + 1e-3 * n for n in NS]
    assert fit_power_law(NS, ys).p < 0.75  # every point: the overhead drags the slope down
    fit = large_n_fit(NS, ys)
    assert (fit.n_min, fit.n_max, fit.points) == (1024, 4096, 3)  # 1.22 ms is the first ≥ 4 × 0.264 ms
    assert fit.p == pytest.approx(0.9, abs=0.05)


def test_no_slope_where_the_cost_never_grew():
    # the window case on a loaded machine: overhead and noise only, the old fit said p = 0.23
    ys = [0.31, 0.30, 0.33, 0.29, 0.35, 0.40, 0.38]
    assert fit_power_law(NS[3:], ys[3:]).p == pytest.approx(0.23, abs=0.1)
    assert large_n_fit(NS, ys) is None


def test_a_slow_small_n_does_not_start_the_fit():
    ys = [9.0, 0.5, 0.6, 1.0, 2.1, 4.0, 8.2]  # a load spike at n = 64
    fit = large_n_fit(NS, ys)
    assert fit.n_min >= 512 and fit.p == pytest.approx(1.0, abs=0.1)


def test_slopes_per_variant_from_records():
    recs = records("naive", [1e-5 * n * n + 0.01 for n in NS]) + records("linear", [1e-3 * n for n in NS])
    fits = slopes(recs + [dict(n=8192, impl="naive", status="skipped", ms=None)], "ms")
    assert fits["naive"].p == pytest.approx(2.0, abs=0.05) and fits["linear"].p == pytest.approx(1.0)


def test_quiet_timings_are_not_noisy():
    assert not noise_verdict(records("naive", [1e-5 * n * n for n in NS])).noisy
    assert noise_verdict(records("naive", [1e-5 * n * n for n in NS])).line() == ""


def test_a_wide_spread_is_noisy():
    ms = [1e-5 * n * n for n in NS]
    runs = [[m, m, m] for m in ms]
    runs[-1] = [ms[-1] * 0.9, ms[-1], ms[-1] * 2.1]  # 17.4 s against 8.6 s, as a busy machine gave
    v = noise_verdict(records("chunked", ms, runs))
    assert v.noisy and "chunked's runs at n = 4,096 spread" in v.reasons[0]
    assert v.line().startswith("These timings are noisy (") and "quiet machine" in v.line()


def test_a_larger_n_that_ran_faster_is_noisy():
    ms = [1e-5 * n * n for n in NS]
    ms[-1] = ms[-2] * 0.5
    v = noise_verdict(records("naive", ms))
    assert any("naive was faster at n = 4,096" in r for r in v.reasons)


@pytest.mark.parametrize("p", [-1.52, 3.78])
def test_an_impossible_slope_is_noisy(p):
    # the slopes the CLI printed under load, without a word of warning
    ms = [1e3 * (n / 64) ** p for n in NS]
    v = noise_verdict(records("linear", ms))
    if p > 0:
        assert any(f"time slope {p:.2f} is impossible" in r for r in v.reasons), v.reasons
    else:
        assert v.noisy  # the cost fell 500×: a larger n ran faster


def test_the_sentence_names_two_problems_and_counts_the_rest():
    ms = [1e3 * (n / 64) ** 3.78 for n in NS]
    recs = records("naive", ms) + records("linear", ms) + records("window", ms)
    line = noise_verdict(recs).line()
    assert line.count("impossible") == 2 and "and 1 more" in line
