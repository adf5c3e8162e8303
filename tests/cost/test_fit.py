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


# --- a whole model's forward time against n (the explorer's n sweep) ---------------------------------


def test_the_quadratic_fit_says_when_the_data_cannot_carry_one():
    import numpy as np

    from attn_explorer.cost.fit import quadratic_fit

    ns = np.array([8, 16, 32, 64, 128], float)
    fit = quadratic_fit(ns, 1e-3 * ns**2 + 0.05 * ns + 2)
    assert fit.reason == "" and (fit.n_min, fit.n_max) == (8, 128)
    np.testing.assert_allclose(fit.coeffs, [1e-3, 0.05, 2], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(fit.at([128]), [1e-3 * 128**2 + 0.05 * 128 + 2])
    assert quadratic_fit(ns[:4], 1e-3 * ns[:4] ** 2).coeffs is None
    assert "5 different n (so far 4)" in quadratic_fit(ns[:4], 1e-3 * ns[:4] ** 2).reason
    close = np.array([20, 22, 24, 26, 28, 30], float)
    assert "4×" in quadratic_fit(close, close**2).reason  # the lengths do not span enough
    concave = quadratic_fit(ns, 10 * np.sqrt(ns))  # no n² to show
    assert concave.coeffs is None and "a > 0" in concave.reason and concave.doubling is None
    assert quadratic_fit([8, 8, 8, 8, 8], [1, 2, 3, 4, 5]).coeffs is None
    assert "below 0" in quadratic_fit(ns, 1e-3 * (ns - 50) ** 2 - 0.5).reason  # a > 0, but under 0 ms
    assert quadratic_fit([], []).reason.startswith("no fit yet")


def test_the_fit_reports_its_doubling_factor_and_n2_share():
    import numpy as np

    from attn_explorer.cost.fit import doubling_factor, quadratic_fit, quadratic_share

    ns = np.array([32, 64, 128, 256, 512], float)
    pure = quadratic_fit(ns, 2e-3 * ns**2 + 1e-9)
    assert pure.doubling == pytest.approx(4.0, rel=1e-6) and pure.quadratic_share == pytest.approx(1.0, rel=1e-6)
    mixed = quadratic_fit(ns, 1e-3 * ns**2 + 0.5 * ns + 3)
    a, b, c = 1e-3, 0.5, 3
    t = lambda n: a * n * n + b * n + c  # noqa: E731
    assert mixed.doubling == pytest.approx(t(512) / t(256), rel=1e-6)
    assert mixed.quadratic_share == pytest.approx(a * 512**2 / t(512), rel=1e-6)
    assert doubling_factor((1.0, 0.0, 0.0), 512) == 4.0 and doubling_factor((0.0, 1.0, 0.0), 512) == 2.0
    assert quadratic_share((0.0, 1.0, 0.0), 10) == 0.0 and doubling_factor(None, 512) is None
