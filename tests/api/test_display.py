"""The grid's mosaic, pooled in the worker: peaks survive pooling, heads land in their blocks, log is floored."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.api.display import CELL_MAX, LOG_FLOOR, grid_image, pooled_heads


def _reference_pool(a: np.ndarray, k: int) -> np.ndarray:
    """Max over k×k blocks, zero-padded at the end: written the slow, obvious way."""
    L, H, N, _ = a.shape
    m = -(-N // k)
    out = np.zeros((L, H, m, m), a.dtype)
    for i in range(m):
        for j in range(m):
            out[:, :, i, j] = a[:, :, i * k:(i + 1) * k, j * k:(j + 1) * k].max(axis=(2, 3))
    return out


@pytest.mark.parametrize("n, k", [(300, 3), (257, 3), (129, 2), (512, 4), (130, 2)])
def test_pooling_keeps_every_block_maximum(n, k):
    rng = np.random.default_rng(n)
    a = rng.random((2, 3, n, n)).astype(np.float32)
    pooled = pooled_heads(a, CELL_MAX).numpy()
    assert pooled.shape == (2, 3, -(-n // k), -(-n // k)) and pooled.shape[-1] <= CELL_MAX
    np.testing.assert_array_equal(pooled, _reference_pool(a, k))
    assert pooled.max() == a.max()


def test_short_inputs_are_tiled_unpooled_head_by_head():
    rng = np.random.default_rng(0)
    a = rng.random((3, 4, 20, 20)).astype(np.float32)
    g = grid_image(a)
    assert (g.layers, g.heads, g.cell) == (3, 4, 20)
    assert g.weights.dtype == np.float32 and g.weights.shape == (60, 80) and g.weights.flags.c_contiguous
    for layer in range(3):
        for head in range(4):
            np.testing.assert_array_equal(g.weights[layer * 20:(layer + 1) * 20, head * 20:(head + 1) * 20], a[layer, head])


def test_a_single_sharp_peak_survives_in_its_own_cell():
    a = np.zeros((2, 2, 512, 512), np.float32)
    a[1, 0, 400, 37] = 0.9
    g = grid_image(a)
    assert g.cell == 128
    rows, cols = np.nonzero(g.weights)
    assert list(zip(rows, cols)) == [(128 + 100, 9)]  # layer 1, head 0: block (1, 0); 400 // 4, 37 // 4


def test_log_scale_is_floored_and_leveled():
    a = np.array([[[[1.0, 0.1], [1e-7, 0.0]]]], np.float32)
    g = grid_image(a)
    values, levels = g.values(log=True)
    np.testing.assert_allclose(values, [[0.0, -1.0], [LOG_FLOOR, LOG_FLOOR]], atol=1e-6)
    assert levels == (LOG_FLOOR, 0.0) and g.values(log=False)[1] == (0.0, 1.0)
    assert np.isfinite(values).all()
