"""Head statistics and one rollout row from q, k and lse in tiles, against the dense versions on the maps.

Tiny seeded random modules of our own (causal Llama with grouped-query heads, sliding windows and
soft-capping, GPT-2, a BERT encoder, a ViT for the pixel distance); the tiles are forced small so every
layer spans several of them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_explorer.analysis import long
from attn_explorer.analysis.rollout import attention_rollout
from attn_explorer.analysis.stats import head_stats
from attn_explorer.core.encoder import EncoderConfig, TextEncoder
from attn_explorer.core.gpt2 import GPT2, GPT2Config
from attn_explorer.core.hooks import Hooks
from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.vit import ViTConfig, VisionTransformer
from attn_explorer.errors import UserError

TOL = 1e-5
N = 45


def _llama(**kw):
    cfg = dict(vocab_size=97, dim=48, num_layers=3, num_heads=6, num_kv_heads=2, mlp_hidden=64, max_positions=128,
               rope_theta=10000.0)
    cfg.update(kw)
    return Llama(LlamaConfig(**cfg))


MODELS = {
    "llama-gqa": lambda: _llama(),
    "llama-windows": lambda: _llama(sliding_windows=[7, None, 12]),
    "gemma-softcap": lambda: _llama(sliding_windows=[5, None, 5], attn_softcap=3.0, num_kv_heads=1),
    "gpt2": lambda: GPT2(GPT2Config(vocab_size=97, dim=32, num_layers=2, num_heads=4, mlp_hidden=40,
                                    max_positions=64)),
    "bert": lambda: TextEncoder(EncoderConfig(vocab_size=97, dim=32, num_layers=2, num_heads=4, mlp_hidden=40,
                                              max_positions=64)),
}


def _scaled(module: torch.nn.Module, spread: float = 0.4) -> torch.nn.Module:
    """Wider random weights than the defaults, so the heads are peaked and different from each other."""
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 2:
                p.normal_(0.0, spread)
    return module.eval()


def _inputs(name: str, n: int = N) -> dict:
    ids = torch.randint(3, 97, (1, n), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids}
    if name == "bert":
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return inputs


def _dense_and_layers(name: str, dk_scale: float = 1.0, dk_layers=None):
    torch.manual_seed(0)
    module = _scaled(MODELS[name]())
    inputs = _inputs(name)
    with torch.inference_mode():
        att = module(dk_scale=dk_scale, dk_layers=dk_layers, output_attentions=True, **inputs).attentions[0]
    return att.float().numpy(), long.collect_layers(module, inputs, dk_scale, dk_layers)


@pytest.fixture
def small_tiles(monkeypatch):
    """A few hundred probabilities a tile: every layer is cut into many row tiles."""
    monkeypatch.setattr(long, "TILE_ELEMENTS", 6 * 8 * N)


@pytest.mark.parametrize("name", list(MODELS))
def test_tiled_head_stats_equal_the_dense_ones(name, small_tiles):
    att, layers = _dense_and_layers(name, dk_scale=1.7, dk_layers=[0])
    special = np.zeros(N, dtype=bool)
    special[[0, 10, N - 1]] = True
    want = head_stats(att, special)
    seen = []
    got = long.tiled_head_stats(layers, special, progress=lambda f, m: seen.append(f))
    for stat in ("entropy", "sink", "distance", "prev", "next"):
        np.testing.assert_allclose(got.get(stat), want.get(stat), atol=TOL, rtol=0, err_msg=stat)
    assert got.distance_unit == "tokens"
    assert seen and seen[-1] == 1.0 and seen == sorted(seen)
    assert np.ptp(want.entropy) > 0.1 and want.prev.max() > 0  # the heads differ: the comparison means something


def test_windowed_layers_reach_only_their_window(small_tiles):
    att, layers = _dense_and_layers("llama-windows")
    tiles = list(long.row_tiles(layers[0]))
    assert len(tiles) > 3
    for a, b, lo, hi, p in tiles:
        assert hi - lo <= (b - a) + 7 - 1  # rows a..b-1 with a window of 7 reach no further back
        np.testing.assert_allclose(p.numpy(), att[0][:, a:b, lo:hi], atol=TOL, rtol=0)
        assert att[0][:, a:b, :lo].sum() == 0 and att[0][:, a:b, hi:].sum() == 0


def test_patch_distance_in_pixels_equals_the_dense_one(small_tiles):
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, dim=32, num_layers=2, num_heads=4, mlp_hidden=40)
    module = _scaled(VisionTransformer(cfg))
    pixels = torch.randn(1, 3, 40, 48, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        out = module(pixels=pixels, output_attentions=True)
    att = out.attentions[0].float().numpy()
    n = att.shape[-1]
    special = np.zeros(n, dtype=bool)
    special[0] = True
    want = head_stats(att, special, out.grid, 1, 8)
    got = long.tiled_head_stats(long.collect_layers(module, {"pixels": pixels}), special, out.grid, 1, 8)
    assert got.distance_unit == "px" and out.grid == (5, 6)
    for stat in ("entropy", "sink", "distance", "prev", "next"):
        np.testing.assert_allclose(got.get(stat), want.get(stat), atol=TOL, rtol=0, err_msg=stat)


@pytest.mark.parametrize("name", ["llama-gqa", "llama-windows", "gpt2", "bert"])
@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_one_rollout_row_equals_the_dense_rollouts_row(name, fusion, small_tiles):
    att, layers = _dense_and_layers(name)
    for query in (0, 17, N - 1):
        want = attention_rollout(att, fusion)[query]
        got = long.rollout_row(layers, query, fusion)
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0, err_msg=f"query {query}")
    upto = attention_rollout(att, fusion, upto=0)[N - 1]
    np.testing.assert_allclose(long.rollout_row(layers, N - 1, fusion, upto=0), upto, atol=TOL, rtol=0)
    assert abs(float(long.rollout_row(layers, N - 1, fusion).sum()) - 1.0) < 1e-5


def test_a_causal_rollout_row_skips_the_rows_after_its_query(small_tiles, monkeypatch):
    _, layers = _dense_and_layers("llama-gqa")
    computed = []
    tile = long._tile

    def counting(layer, k, a, b):
        computed.append(b)
        return tile(layer, k, a, b)

    monkeypatch.setattr(long, "_tile", counting)
    row = long.rollout_row(layers, 3, "mean")
    per = long._rows_per_tile(layers[0])
    assert per < N // 2 and computed and max(computed) <= per * (3 // per + 1)  # the tiles after row 3: never
    assert row[4:].sum() == 0 and row[:4].sum() == pytest.approx(1.0, abs=1e-6)


def test_bad_requests_get_one_line(small_tiles):
    _, layers = _dense_and_layers("gpt2")
    with pytest.raises(UserError, match="not supported on a long input"):
        long.rollout_row(layers, 0, discard_ratio=0.2)
    with pytest.raises(UserError, match="query 99"):
        long.rollout_row(layers, 99)
    with pytest.raises(UserError, match="head fusion"):
        long.rollout_row(layers, 0, fusion="median")
    with pytest.raises(UserError, match="special has 3 entries"):
        long.tiled_head_stats(layers, [False] * 3)


def test_progress_that_raises_stops_the_work(small_tiles, monkeypatch):
    """A worker's progress callback raises once it is cancelled: the work stops at that tile."""
    _, layers = _dense_and_layers("llama-gqa")
    monkeypatch.setattr(long, "PROGRESS_EVERY_S", 0.0)

    class Stop(Exception):
        pass

    calls = []

    def progress(fraction, message):
        calls.append((fraction, message))
        raise Stop

    with pytest.raises(Stop):
        long.tiled_head_stats(layers, np.zeros(N, dtype=bool), progress=progress)
    with pytest.raises(Stop):
        long.rollout_row(layers, N - 1, progress=progress)
    assert len(calls) == 2 and all(f < 0.2 for f, _ in calls)
    assert calls[0][1].startswith("measuring every head") and calls[1][1].startswith("rolling out one row")


def test_a_runs_lazy_store_gives_the_same_numbers(small_tiles):
    """RunResult.lazy (api.lazy.LazyAttention) is read as it is: stats and a rollout row equal the dense ones."""
    from attn_explorer.api.lazy import LazyAttention

    att, _ = _dense_and_layers("llama-windows", dk_scale=0.6)
    torch.manual_seed(0)
    module = _scaled(MODELS["llama-windows"]())
    hooks = Hooks(keep=True)  # every layer keeps q, k and lse in hooks.kept
    with torch.inference_mode():
        module(dk_scale=0.6, hooks=hooks, **_inputs("llama-windows"))
    assert sorted(hooks.kept) == [0, 1, 2]
    layers = long.layers_of(LazyAttention.from_kept(hooks.kept))
    special = np.zeros(N, dtype=bool)
    got, want = long.tiled_head_stats(layers, special), head_stats(att, special)
    for stat in ("entropy", "sink", "distance", "prev", "next"):
        np.testing.assert_allclose(got.get(stat), want.get(stat), atol=TOL, rtol=0, err_msg=stat)
    np.testing.assert_allclose(long.rollout_row(layers, N - 1), attention_rollout(att)[N - 1], atol=TOL, rtol=0)
