"""The cost lab's measuring loop: memory ledger, guard, failures, cancel, progress and fits."""
from __future__ import annotations

import math

import pytest
import torch

from attn_explorer.core import efficient
from attn_explorer.cost import measure
from attn_explorer.cost.config import SweepConfig
from attn_explorer.cost.fit import slopes
from attn_explorer.cost.measure import Measurement, Progress
from attn_explorer.cost.memory import default_budget, human_bytes, run_measuring_memory
from attn_explorer.cost.variants import VARIANTS, point_bytes

CPU = torch.device("cpu")
# Small enough to be quick, big enough that the n² term and the O(n) terms separate cleanly.
SMALL = dict(heads=2, d_k=64, repeats=1, q_block=16, k_block=16, window=16)


def sweep(cfg: SweepConfig, **kw) -> list[Measurement]:
    """The measured points of a sweep, without its progress reports."""
    return [r for r in measure.sweep(cfg, **kw) if isinstance(r, Measurement)]


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
    # naive holds the n×n scores plus O(n) tensors (scaled q, the output): the n² part quadruples with each
    # doubling of n, exactly; f(2n) − 2·f(n) cancels the O(n) part, leaving 2·a·n²
    peak = {r["n"]: r["peak_bytes"] for r in small_sweep if r["impl"] == "naive"}
    quad = {n: peak[2 * n] - 2 * peak[n] for n in (128, 256)}
    assert quad[256] / quad[128] == pytest.approx(4, rel=0.02)
    assert 1.6 < fits["naive"].p <= 2.05  # the O(n) part still shows at n ≤ 512
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
    recs = sweep(SweepConfig(ns=[16], impls=["naive", "window"], **SMALL))
    assert recs[1].impl == "window" and recs[1].rel_error < 1e-6


def test_error_falls_back_to_sdpa_without_naive():
    recs = sweep(SweepConfig(ns=[64], impls=["chunked", "sdpa"], **SMALL))
    assert [r.impl for r in recs] == ["sdpa", "chunked"]  # the reference runs first
    assert recs[1].reference == "sdpa" and recs[1].rel_error < 1e-5


# --- the guard ------------------------------------------------------------------------------


def test_guard_skips_an_oversized_run_without_calling_it(monkeypatch):
    called = []

    def spy(*args, **kwargs):
        called.append(args[0].shape)
        raise AssertionError("the guard should have stopped this call")

    monkeypatch.setattr(efficient, "naive", spy)
    n = 1024
    cfg = SweepConfig(ns=[n], impls=["naive", "chunked"], **(SMALL | dict(q_block=256, k_block=256)))
    need_naive = point_bytes("naive", n, cfg)[1]
    need_chunked = point_bytes("chunked", n, cfg)[1]
    assert need_chunked < need_naive
    cfg.budget_bytes = budget = (need_chunked + need_naive) // 2
    recs = sweep(cfg)
    assert called == []
    naive_rec, chunked_rec = recs
    assert naive_rec.status == "skipped" and naive_rec.ms is None and naive_rec.peak_bytes is None
    assert naive_rec.message == f"skipped: would need {human_bytes(need_naive)} (budget {human_bytes(budget)})"
    assert chunked_rec.status == "ok" and chunked_rec.rel_error is None  # no reference ran


def test_guard_makes_no_inputs_when_nothing_fits(monkeypatch):
    def no_randn(*args, **kwargs):
        raise AssertionError("inputs were allocated for a point that cannot run")

    monkeypatch.setattr(measure.torch, "randn", no_randn)
    recs = sweep(SweepConfig(ns=[1 << 20], impls=["naive", "linear"], budget_bytes=1000, **SMALL))
    assert [r.status for r in recs] == ["skipped", "skipped"]
    assert "GB" in recs[0].message  # naive at n = 2^20 needs terabytes: the message says how much


def test_predictions_grow_as_the_variant_should():
    cfg = SweepConfig(ns=[1])  # 12 heads, d_k = 64, float32

    def predict_bytes(impl, n):
        return VARIANTS[impl].call_bytes(n, cfg)

    def ratio(impl):  # doubling n at a large n, where fixed scratch no longer counts
        return predict_bytes(impl, 1 << 20) / predict_bytes(impl, 1 << 19)

    assert ratio("naive") == pytest.approx(4, rel=0.01)
    for impl in ("chunked", "window", "linear"):
        assert 1.9 < ratio(impl) <= 2.01, impl
    # one layer of 12 heads at n = 16384 in float32: about 12.9 GB of scores for naive
    assert predict_bytes("naive", 16384) > 12.8e9
    assert predict_bytes("chunked", 16384) < 300e6


def test_the_guard_predicts_chunkeds_automatic_tile_with_the_same_rule():
    from attn_explorer.cost.variants import chunked_q_block

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

    monkeypatch.setattr(efficient, "window", oom)
    recs = sweep(SweepConfig(ns=[32, 64], impls=["window", "linear"], **SMALL))
    assert [(r.n, r.impl, r.status) for r in recs] == [
        (32, "window", "failed"), (32, "linear", "ok"), (64, "window", "failed"), (64, "linear", "ok")]
    assert recs[0].message == "RuntimeError: DefaultCPUAllocator: not enough memory:"  # errors.error_message


def test_cancel_stops_the_sweep_and_progress_counts_every_call():
    seen: list[Measurement] = []
    cfg = SweepConfig(ns=[16, 32, 64, 128], impls=["chunked", "linear"], **(SMALL | dict(repeats=2)))
    progress = []
    for item in measure.sweep(cfg, cancelled=lambda: len(seen) >= 3):
        (seen if isinstance(item, Measurement) else progress).append(item)
    assert len(seen) == 4  # the two points of n = 32 arrive together; the sweep stops before n = 64's first call
    assert [p.done for p in progress] == list(range(len(progress)))

    items = list(measure.sweep(cfg))
    progress = [p for p in items if isinstance(p, Progress)]
    assert len(items) - len(progress) == 8
    assert all(p.total == 4 * 2 * (1 + 2) for p in progress)  # a warm-up and 2 timed runs per point
    assert progress[-1].done == progress[-1].total and progress[-1].message == "done"


def test_timed_runs_are_interleaved_across_the_variants(monkeypatch):
    # a burst of load must hit every variant alike: round-robin, not all of one variant's runs in a row
    order = []
    for name in ("naive", "linear", "window"):
        real = getattr(efficient, name)
        monkeypatch.setattr(efficient, name, lambda *a, _f=real, _n=name, **k: order.append(_n) or _f(*a, **k))
    sweep(SweepConfig(ns=[64], impls=["naive", "linear", "window"], **(SMALL | dict(repeats=3))))
    warm, timed = order[:3], order[3:]
    assert warm == ["naive", "linear", "window"]
    assert [timed[i:i + 3] for i in (0, 3, 6)] == [["naive", "linear", "window"], ["linear", "window", "naive"],
                                                    ["window", "naive", "linear"]]  # the order rotates


def test_each_point_reports_its_spread(small_sweep):
    for r in small_sweep:
        assert r["ms_min"] == min(r["ms_runs"]) and r["ms_max"] == max(r["ms_runs"])
        assert r["ms_min"] <= r["ms"] <= r["ms_max"]
        assert r["seconds"] >= sum(r["ms_runs"]) / 1000


def test_the_sweep_estimates_the_time_left_once_every_variant_has_a_point():
    cfg = SweepConfig(ns=[32, 64, 128], impls=["naive", "linear"], **(SMALL | dict(repeats=2)))
    items = list(measure.sweep(cfg))
    first_point = next(i for i, x in enumerate(items) if isinstance(x, Measurement))
    etas = [x.eta_s for x in items if isinstance(x, Progress)]
    before = [x.eta_s for x in items[:first_point] if isinstance(x, Progress)]
    assert before and all(e is None for e in before)  # nothing measured yet: no guess
    after = [x.eta_s for x in items[first_point:] if isinstance(x, Progress)]
    assert all(e is not None and e >= 0 for e in after)
    assert etas[-1] == 0.0


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
        sweep(cfg)


def test_records_are_plain_data():
    rec = sweep(SweepConfig(ns=[16], impls=["linear"], **SMALL))[0]
    d = rec.to_dict()
    assert set(d) >= {"n", "impl", "status", "ms", "ms_min", "ms_max", "ms_runs", "peak_bytes", "predicted_bytes",
                      "matrix_bytes", "rel_error", "message"}
    assert all(isinstance(v, (int, float, str, list, type(None))) for v in d.values())


