"""The cost lab's measuring loop: memory ledger, guard, failures, cancel, progress and fits."""
from __future__ import annotations

import math

import pytest
import torch

from attn_explorer.core import efficient
from attn_explorer.cost import measure
from attn_explorer.cost.fit import fit_power_law, slopes, tail_fit
from attn_explorer.cost.measure import Measurement, SweepConfig, sweep
from attn_explorer.cost.memory import default_budget, human_bytes, predict_bytes, run_measuring_memory

CPU = torch.device("cpu")
# Small enough to be quick, big enough that the n² term and the O(n) terms separate cleanly.
SMALL = dict(heads=2, d_k=64, repeats=1, q_block=16, k_block=16, window=16)


@pytest.fixture(scope="module")
def small_sweep() -> list[dict]:
    cfg = SweepConfig(ns=[64, 128, 256, 512], **SMALL)
    return [r.to_dict() for r in sweep(cfg)]


# --- the memory ledger ----------------------------------------------------------------------


def test_cpu_peak_is_the_allocators_count_of_live_tensor_bytes():
    def job():
        a = torch.empty(1000, dtype=torch.float32)  # 4,000 B
        b = torch.empty(2000, dtype=torch.float32)  # 8,000 B: 12,000 B live together
        del a
        c = torch.empty(500, dtype=torch.float64)  # 4,000 B: only 12,000 B again
        return b, c

    (b, c), peak, method = run_measuring_memory(job, CPU)
    assert method == "cpu-profiler"
    assert peak == 12_000


def test_measured_peaks_stay_under_the_guards_prediction(small_sweep):
    for r in small_sweep:
        assert r["status"] == "ok", r
        assert 0 < r["peak_bytes"] <= r["predicted_bytes"], r


def test_naive_holds_the_score_matrix_and_chunked_does_not(small_sweep):
    at = {(r["n"], r["impl"]): r for r in small_sweep}
    n = 512
    scores = at[n, "naive"]["matrix_bytes"]
    assert scores == 2 * n * n * 4
    assert at[n, "naive"]["peak_bytes"] >= scores
    assert at[n, "chunked"]["peak_bytes"] < scores / 4
    assert at[n, "window"]["peak_bytes"] < scores / 2


def test_chunked_scratch_beyond_its_output_does_not_grow_with_n(small_sweep):
    # chunked keeps the (B, H, n, d) output plus one tile and one block of rows: a constant
    out_bytes = {r["n"]: 2 * r["n"] * 64 * 4 for r in small_sweep}
    scratch = {r["n"]: r["peak_bytes"] - out_bytes[r["n"]] for r in small_sweep if r["impl"] == "chunked"}
    assert len(set(scratch.values())) == 1, scratch
    assert 0 < scratch[512] < out_bytes[128]


def test_memory_slopes(small_sweep):
    fits = slopes(small_sweep, "peak_bytes")
    assert fits["naive"].p == pytest.approx(2.0, abs=0.05)
    assert fits["window"].p == pytest.approx(1.0, abs=0.05)
    assert fits["chunked"].p == pytest.approx(1.0, abs=0.1)
    assert fits["linear"].p == pytest.approx(1.0, abs=0.1)
    assert fits["naive"].n_max == 512 and fits["naive"].points == 3


def test_errors_against_exact_attention(small_sweep):
    for r in small_sweep:
        if r["impl"] == "naive":
            assert r["rel_error"] is None
            continue
        assert r["reference"] == "naive"
        if r["impl"] in ("chunked", "sdpa"):
            assert r["rel_error"] < 1e-5
        elif r["impl"] == "linear":
            assert r["rel_error"] > 1e-2  # an approximation, and the number says so
    window_at = {r["n"]: r["rel_error"] for r in small_sweep if r["impl"] == "window"}
    assert window_at[64] > 1e-2  # window 16 < n


def test_window_error_vanishes_when_the_window_covers_n():
    recs = list(sweep(SweepConfig(ns=[16], impls=["naive", "window"], **SMALL)))
    assert recs[1].impl == "window" and recs[1].rel_error < 1e-6


def test_error_falls_back_to_sdpa_without_naive():
    recs = list(sweep(SweepConfig(ns=[64], impls=["chunked", "sdpa"], **SMALL)))
    assert [r.impl for r in recs] == ["sdpa", "chunked"]  # the reference runs first
    assert recs[1].reference == "sdpa" and recs[1].rel_error < 1e-5


# --- the guard ------------------------------------------------------------------------------


def test_guard_skips_an_oversized_run_without_calling_it(monkeypatch):
    called = []

    def spy(*args, **kwargs):
        called.append(args[0].shape)
        raise AssertionError("the guard should have stopped this call")

    monkeypatch.setitem(efficient.VARIANTS, "naive", spy)
    n = 1024
    cfg = SweepConfig(ns=[n], impls=["naive", "chunked"], **(SMALL | dict(q_block=256, k_block=256)))
    need_naive = measure.predicted_need("naive", n, cfg)[1]
    need_chunked = measure.predicted_need("chunked", n, cfg)[1]
    assert need_chunked < need_naive
    cfg.budget_bytes = budget = (need_chunked + need_naive) // 2
    recs = list(sweep(cfg))
    assert called == []
    naive_rec, chunked_rec = recs
    assert naive_rec.status == "skipped" and naive_rec.ms is None and naive_rec.peak_bytes is None
    assert naive_rec.message == f"skipped: would need {human_bytes(need_naive)} (budget {human_bytes(budget)})"
    assert chunked_rec.status == "ok" and chunked_rec.rel_error is None  # no reference ran


def test_guard_makes_no_inputs_when_nothing_fits(monkeypatch):
    def no_randn(*args, **kwargs):
        raise AssertionError("inputs were allocated for a point that cannot run")

    monkeypatch.setattr(measure.torch, "randn", no_randn)
    recs = list(sweep(SweepConfig(ns=[1 << 20], impls=["naive", "linear"], budget_bytes=1000, **SMALL)))
    assert [r.status for r in recs] == ["skipped", "skipped"]
    assert "GB" in recs[0].message  # naive at n = 2^20 needs terabytes: the message says how much


def test_predictions_grow_as_the_variant_should():
    def ratio(impl):  # doubling n at a large n, where fixed scratch no longer counts
        return predict_bytes(impl, 1 << 20, 12, 64) / predict_bytes(impl, 1 << 19, 12, 64)

    assert ratio("naive") == pytest.approx(4, rel=0.01)
    for impl in ("chunked", "window", "linear"):
        assert 1.9 < ratio(impl) <= 2.01, impl
    # one layer of 12 heads at n = 16384 in float32: about 12.9 GB of scores for naive
    assert predict_bytes("naive", 16384, 12, 64) > 12.8e9
    assert predict_bytes("chunked", 16384, 12, 64) < 300e6


def test_the_guard_predicts_chunkeds_automatic_tile_with_the_same_rule():
    from attn_explorer.cost.memory import chunked_q_block

    for n in (1, 64, 4095, 4096, 8192, 20000, 32768, 1 << 20):
        assert chunked_q_block(n) == efficient.auto_q_block(n), n
    assert efficient.auto_q_block(4096) == 128 and efficient.auto_q_block(1 << 16) == 1024


def test_default_budget_is_a_share_of_free_memory():
    budget = default_budget(CPU)
    assert 0 < budget < 2**50


# --- failures, cancel, progress -------------------------------------------------------------


def test_a_failing_variant_marks_its_point_and_the_rest_go_on(monkeypatch):
    def oom(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: not enough memory:\n you tried to allocate 12 GB")

    monkeypatch.setitem(efficient.VARIANTS, "window", oom)
    recs = list(sweep(SweepConfig(ns=[32, 64], impls=["window", "linear"], **SMALL)))
    assert [(r.n, r.impl, r.status) for r in recs] == [
        (32, "window", "failed"), (32, "linear", "ok"), (64, "window", "failed"), (64, "linear", "ok")]
    assert recs[0].message == "RuntimeError: DefaultCPUAllocator: not enough memory: you tried to allocate 12 GB"


def test_cancel_stops_the_sweep_and_progress_counts_up():
    seen: list[Measurement] = []
    progress: list[tuple[int, int, str]] = []
    cfg = SweepConfig(ns=[16, 32, 64, 128], impls=["chunked", "linear"], **SMALL)
    for rec in sweep(cfg, cancelled=lambda: len(seen) >= 3, progress=lambda *a: progress.append(a)):
        seen.append(rec)
    assert len(seen) == 3
    assert [p[0] for p in progress] == [0, 1, 2]
    assert all(p[1] == 8 for p in progress)

    progress.clear()
    assert len(list(sweep(cfg, progress=lambda *a: progress.append(a)))) == 8
    assert progress[-1] == (8, 8, "done")


@pytest.mark.parametrize("field,value,message", [
    ("ns", [64, 0], "positive integer"),
    ("ns", [], "no sequence lengths"),
    ("impls", ["fast"], "unknown variant 'fast'"),
    ("heads", 0, "heads must be"),
    ("budget_bytes", -5, "memory budget"),
    ("dtype", "int8", "unknown dtype"),
])
def test_bad_config_says_what_is_wrong(field, value, message):
    cfg = SweepConfig(ns=[64])
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=message):
        list(sweep(cfg))


def test_records_are_plain_data():
    rec = next(sweep(SweepConfig(ns=[16], impls=["linear"], **SMALL)))
    d = rec.to_dict()
    assert set(d) >= {"n", "impl", "status", "ms", "ms_runs", "peak_bytes", "predicted_bytes", "matrix_bytes",
                      "rel_error", "message"}
    assert all(isinstance(v, (int, float, str, list, type(None))) for v in d.values())


# --- fits -----------------------------------------------------------------------------------


def test_power_law_fit_recovers_the_exponent():
    ns = [64, 128, 256, 512, 1024]
    fit = fit_power_law(ns, [3.0 * n**1.5 for n in ns])
    assert fit.p == pytest.approx(1.5) and fit.a == pytest.approx(3.0)
    assert fit_power_law([64], [1.0]) is None


def test_tail_fit_uses_the_large_sizes():
    ns = [64, 128, 256, 512, 1024, 2048]
    ys = [1e6 + 10.0 * n for n in ns]  # a constant hides the linear growth at small n
    assert tail_fit(ns, ys, tail=1.0).p < tail_fit(ns, ys).p
    assert tail_fit(ns, ys).n_min == 512 and tail_fit(ns, ys).points == 3
    assert math.isclose(tail_fit(ns[:2], ys[:2]).p, fit_power_law(ns[:2], ys[:2]).p)
