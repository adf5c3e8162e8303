"""Issue 24 B, the offer's arithmetic: X = Y × (1 − f + f·r), where Y is the float32 run's measured forward, f the
share of it the model's products and attention take at this machine's measured float32 rates, and r how much
faster they ran in bfloat16 here; the rates come from timing the model's own shapes (core.bf16_rate)."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from attn_explorer.session import bf16_offer as bo


RATES = {"float32": {"linear_s_per_token": 1e-3, "attn_s_per_pair": 1e-8},
         "bfloat16": {"linear_s_per_token": 0.25e-3, "attn_s_per_pair": 0.5e-8}}


def test_attention_pairs_count_causal_local_and_bidirectional_layers():
    assert bo.attention_pairs(4, ("global",), causal=True, layers=1) == 10  # 1 + 2 + 3 + 4
    # a window of 2: the first query sees 1 key, every later one 2
    assert bo.attention_pairs(4, ("local, window 2",), causal=True, layers=1) == 1 + 2 + 2 + 2
    assert bo.attention_pairs(4, (), causal=False, layers=3) == 3 * 16
    # a window wider than the input is a global layer; a recurrent layer has no query-key pairs
    assert bo.attention_pairs(4, ("local, window 512", "global"), causal=True, layers=2) == 20
    assert bo.attention_pairs(4, (), causal=True, layers=2, mixers=("softmax", "mamba2")) == 10


def test_the_estimate_scales_only_the_measured_arithmetic_share():
    # 1,000 tokens: products 1e-3 s a token = 1 s; attention 2 heads × 500,500 pairs × 1e-8 s ≈ 0.01 s
    e = bo.estimate(forward_s=4.0, tokens=1000, rates=RATES, heads=2, pairs=500_500)
    a32 = 1.0 + 2 * 500_500 * 1e-8
    a16 = 0.25 + 2 * 500_500 * 0.5e-8
    assert e["share"] == pytest.approx(a32 / 4.0)
    assert e["bf16_s"] == pytest.approx(4.0 - a32 + a16)  # the rest of the forward is taken as it is
    assert e["f32_s"] == 4.0 and e["ratio"] == pytest.approx(e["bf16_s"] / 4.0)
    assert e["products_ratio"] == pytest.approx(0.25) and e["attn_ratio"] == pytest.approx(0.5)


def test_the_share_is_at_most_the_whole_forward():
    # the arithmetic at float32 rates would take 10 s, the run took 2 s: all of it is arithmetic, none more
    e = bo.estimate(forward_s=2.0, tokens=10_000, rates=RATES, heads=1, pairs=0)
    assert e["share"] == 1.0 and e["bf16_s"] == pytest.approx(2.0 * 0.25)


def test_measured_rates_with_a_stubbed_clock():
    from attn_explorer.core.bf16_rate import ROWS, ATTN_TOKENS, measure_rates

    ticks = itertools.count(0.0, 0.5)  # every timed call lasts 0.5 s on this clock, whatever it does
    d = measure_rates(((8, 16), (8, 16), (16, 8)), heads=2, head_dim=4, clock=lambda: next(ticks))
    for dt in ("float32", "bfloat16"):  # two (8, 16) and one (16, 8): three products of 0.5 s each
        assert d[dt]["linear_s_per_token"] == pytest.approx(3 * 0.5 / ROWS)
        assert d[dt]["attn_s_per_pair"] == pytest.approx(0.5 / (2 * ATTN_TOKENS * (ATTN_TOKENS + 1) / 2))


def test_the_job_says_no_where_the_cpu_has_no_native_bf16(monkeypatch):
    import attn_explorer.core.bf16 as core_bf16

    monkeypatch.setattr(core_bf16, "native_bf16", lambda: False)
    assert bo.estimate_job(SimpleNamespace(), 5000, 10.0) == {"native": False}


def test_the_job_on_a_real_tiny_model(monkeypatch):
    import attn_explorer as ax
    import attn_explorer.core.bf16 as core_bf16

    monkeypatch.setattr(core_bf16, "native_bf16", lambda: True)
    m = ax.load_model("textbook", device="cpu")
    d = bo.estimate_job(m, 3000, 5.0)
    assert d["native"] and d["f32_s"] == 5.0 and 0 < d["bf16_s"] and d["tokens"] == 3000
    assert d["bf16_s"] == pytest.approx(5.0 * d["ratio"])


def _info(**kw):
    base = dict(dtype="float32", device="cpu", num_layers=2, num_heads=2, causal=True, layer_kinds=(), mixers=())
    return SimpleNamespace(**{**base, **kw})


def _result(n=5000, forward_ms=10_000.0, reuse="", warm_up=False):
    return SimpleNamespace(num_tokens=n, forward_ms=forward_ms, reuse=reuse, warm_up=warm_up, lazy=None)


def test_what_is_long_enough_to_offer():
    assert bo.why_not(_info(), _result()) == ""
    assert "float32" in bo.why_not(_info(dtype="bfloat16"), _result())
    assert "cpu" in bo.why_not(_info(device="cuda"), _result())
    assert "tokens" in bo.why_not(_info(), _result(n=bo.LONG_TOKENS - 1))
    assert "s" in bo.why_not(_info(), _result(forward_ms=bo.LONG_FORWARD_S * 1000 - 1))
    assert "reused" in bo.why_not(_info(), _result(reuse="reused 4,000 of 5,000 tokens"))
    assert bo.why_not(_info(), _result(reuse="reused 0 of 5,000 tokens (this model keeps no KV cache)")) == ""


def test_the_line_says_about_and_how_it_was_estimated():
    line, tip = bo.offer_text({"f32_s": 9.04, "bf16_s": 4.1, "tokens": 4096, "products_ratio": 0.3,
                               "attn_ratio": 0.6, "share": 0.8, "ratio": 0.45, "native": True})
    assert line.startswith("bfloat16 would take about 4.1 s instead of 9.0 s")
    assert "estimated" in line and "vs float32" in line
    assert "4,096 tokens" in tip and "3.3×" in tip and "reloads" in tip


def test_an_offer_from_a_forward_timed_beside_other_jobs_says_so():
    """The offer's "instead of Y" is the run's own forward time; when that run shared the cores with other jobs
    (SessionState.shared_cores), the tooltip says so, as the status bar's forward label does."""
    d = {"f32_s": 9.04, "bf16_s": 4.1, "tokens": 4096, "products_ratio": 0.3, "attn_ratio": 0.6, "share": 0.8,
         "ratio": 0.45, "native": True}
    assert "beside other jobs" not in bo.offer_text(d)[1]
    tip = bo.offer_text({**d, "beside": True})[1]
    assert "4,096 tokens (beside other jobs: the model alone takes less, and so would bfloat16)" in tip


def test_the_offers_line_itself_says_its_forward_ran_beside_other_jobs():
    """Y ("instead of Y") is the shared run's own time, so both figures are high: every way the status bar may
    show the line says so, down to the shortest, not only the tooltip."""
    d = {"f32_s": 9.04, "bf16_s": 4.1, "tokens": 4096, "products_ratio": 0.3, "attn_ratio": 0.6, "share": 0.8,
         "ratio": 0.45, "native": True}
    assert not any("beside" in v for v in bo.offer_variants(d))
    shared = bo.offer_variants({**d, "beside": True})
    assert all("beside other jobs" in v for v in shared)
    assert shared[0].startswith("bfloat16 would take about 4.1 s instead of 9.0 s")
    assert bo.offer_text({**d, "beside": True})[0] == shared[0]
    assert [len(v) for v in shared] == sorted((len(v) for v in shared), reverse=True)  # longest first
