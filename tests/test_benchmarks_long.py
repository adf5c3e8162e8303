"""benchmarks/bench_long.py's pieces, at tiny sizes: the floor's windowed band covers exactly the window,
the floor measures every layer, and the tables fill every column (the full run is a benchmark, not a test)."""
from __future__ import annotations

import pytest
import torch

from benchmarks.bench_long import main, tables
from benchmarks.long_floor import band_tiles, floor_ms


@pytest.mark.parametrize("n,w", [(1, 4), (5, 4), (8, 4), (13, 4), (10, 1), (7, 7), (30, 6)])
def test_band_tiles_cover_exactly_the_sliding_window(n, w):
    seen = set()
    for (qa, qb), (ka, kb), mask in band_tiles(n, w):
        if mask is None:
            mask = torch.ones(qb - qa, kb - ka, dtype=torch.bool).tril()
        assert mask.shape == (qb - qa, kb - ka)
        seen |= {(qa + i, ka + j) for i, j in mask.nonzero().tolist()}
    assert seen == {(p, k) for p in range(n) for k in range(max(0, p - w + 1), p + 1)}


def test_floor_times_every_layer_signature(tmp_path):
    import attn_explorer as ax
    from tests.tiny_llama import make_llama_folder

    folder = make_llama_folder(tmp_path / "tiny", num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=1, hidden_size=64)
    m = ax.load_model(str(folder), device="cpu")
    m.module.cfg.sliding_windows = [8, None]  # one windowed layer, one global: both kernels' paths
    f = floor_ms(m.module, 40, torch.float32)
    assert f["linear_ms"] > 0 and f["attention_ms"] > 0
    assert f["ms"] == pytest.approx(f["linear_ms"] + f["attention_ms"])


def test_tables_fill_every_column():
    d = {"floor_ms": 100.0, "linear_ms": 60.0, "attention_ms": 40.0, "lazy_ms": 120.0, "hf_ms": 300.0,
         "plain_ms": None, "lazy_over_floor": [1.2], "lazy_over_hf": [0.4], "lazy_over_plain": [], "kept": 10,
         "dense": 1000, "pool_local_ms": 1.0, "pool_global_ms": 2.0, "window_ms": 0.5, "row_ms": 0.1,
         "eager_bytes": 4096, "eager_ms": 50.0}
    rows = [{"n": 4096, "model": "m", "L": 2, "H": 4, "rss": 1 << 20, "bf16_over_f32": [0.3],
             "by_dtype": {"float32": d, "bfloat16": dict(d, lazy_over_floor=[1.4])}}]
    text = tables(rows, ["float32", "bfloat16"], plain=False)
    assert "### float32" in text and "### bfloat16" in text and "not run" not in text
    ratios = text.split("### Ratios")[1].splitlines()[-1]
    assert ratios == "| 4,096 | 1.20× ✓ | 1.40× ✗ | 0.40× ✓ | 0.40× ✓ | 0.30× ✓ |"


def test_unknown_dtype_is_refused():
    with pytest.raises(SystemExit):
        main(["--dtypes", "float32,float16", "--quick"])


def test_ratios_show_the_spread_of_their_repeats():
    """The shared machines swing by 40 % between repeats (2026-12-03: a float32 repeat's floor 7.0 s, the next
    10.8 s): a ratio of several repeats shows their range beside the median, so a reader sees how far to trust it."""
    d = {"floor_ms": 100.0, "linear_ms": 60.0, "attention_ms": 40.0, "lazy_ms": 120.0, "hf_ms": 300.0,
         "plain_ms": None, "lazy_over_floor": [1.2, 1.05, 1.4], "lazy_over_hf": [0.4, 0.6], "lazy_over_plain": [],
         "kept": 10, "dense": 1000, "pool_local_ms": 1.0, "pool_global_ms": 2.0, "window_ms": 0.5, "row_ms": 0.1,
         "eager_bytes": 4096, "eager_ms": 50.0}
    rows = [{"n": 4096, "model": "m", "L": 2, "H": 4, "rss": 1 << 20, "bf16_over_f32": [0.3],
             "by_dtype": {"float32": d}}]
    text = tables(rows, ["float32"], plain=False)
    assert text.split("### Ratios")[1].splitlines()[-1] == "| 4,096 | 1.20× ✓ (1.05–1.40) | 0.50× ✓ (0.40–0.60) |"
    assert "| 1.20× (1.05–1.40) | 0.50× (0.40–0.60) |" in text  # the dtype's own table too


def test_the_floor_times_q_k_and_v_where_they_are_not_packed(tmp_path, monkeypatch):
    """Where core.linear does not pack (its product answers None), the floor times q's, k's and v's products
    each, as the forward runs them: it timed q's alone (a bfloat16 model on an AMX CPU takes that path)."""
    import torch.nn.functional as F

    import attn_explorer as ax
    from attn_explorer.core import linear
    from benchmarks.long_floor import _product_groups
    from tests.tiny_llama import make_llama_folder

    folder = make_llama_folder(tmp_path / "tiny", num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=1, hidden_size=64)
    layer = ax.load_model(str(folder), device="cpu").module.blocks.layers[0]
    monkeypatch.setattr(linear, "path_choice", "plain")
    linears = [mod for mod in layer.modules() if isinstance(mod, torch.nn.Linear)]
    calls = []
    real = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: calls.append(tuple(w.shape)) or real(x, w, b))
    for run, width in _product_groups(layer, linears):
        run(torch.randn(3, width))
    assert sorted(calls) == sorted(tuple(mod.weight.shape) for mod in linears)


def test_the_floor_is_timed_with_the_forwards_heap(tmp_path, monkeypatch):
    """A long forward keeps its freed large blocks in the heap (core.heap.large_blocks_kept); the floor timed
    outside it paid a page fault for every page of every product's output: at 16,384 tokens, bfloat16, its
    products took 9.8 s against 4.1-5.1 s inside (2026-12-03), so the floor flattered the forward. Every product
    and kernel of the floor now runs inside it."""
    import torch.nn.functional as F

    import attn_explorer as ax
    from attn_explorer.core import heap
    from tests.tiny_llama import make_llama_folder

    folder = make_llama_folder(tmp_path / "tiny", num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=1, hidden_size=64)
    m = ax.load_model(str(folder), device="cpu")
    m.module.cfg.sliding_windows = [8, None]
    inside = []
    real_linear, real_sdpa = F.linear, F.scaled_dot_product_attention
    monkeypatch.setattr(F, "linear", lambda *a, **k: inside.append(heap._INSIDE[0] > 0) or real_linear(*a, **k))
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **k: inside.append(heap._INSIDE[0] > 0) or real_sdpa(*a, **k))
    from attn_explorer.core import linear
    monkeypatch.setattr(linear, "path_choice", "plain")  # every product through F.linear, where it is seen
    floor_ms(m.module, 40, torch.float32)
    assert inside and all(inside)
