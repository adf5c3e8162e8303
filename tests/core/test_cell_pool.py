"""The band-by-band pooled views of recurrent heads (core.cell_pool, KeptMamba.pooled): equal to the dense map
pooled by hand, for n not divisible by the cells, bands that straddle cells or sit inside one, windows of rows and
columns, and a decay that vanishes (exp(cum_t - cum_s) underflowing far from the diagonal)."""
import pytest
import torch

from attn_explorer.core.cell_pool import CellPool
from attn_explorer.core.lazy import pool_edges
from attn_explorer.core.mamba2 import KeptMamba, implicit_map


def dense_pool(a: torch.Tensor, re, ce, reduce: str) -> torch.Tensor:
    out = torch.empty(len(re) - 1, len(ce) - 1)
    for i in range(len(re) - 1):
        for j in range(len(ce) - 1):
            cell = a[int(re[i]):int(re[i + 1]), int(ce[j]):int(ce[j + 1])]
            out[i, j] = cell.double().mean() if reduce == "mean" else cell.reshape(-1)[cell.abs().argmax()]
    return out


def kept(n: int, heads: int = 4, groups: int = 2, S: int = 8, strong: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dt = torch.nn.functional.softplus(torch.randn(1, n, heads, generator=g)) * strong
    A = -torch.rand(heads, generator=g) * 2 - 0.1
    B, C = (torch.randn(1, n, groups, S, generator=g) for _ in range(2))
    return KeptMamba(dt, A, B, C), implicit_map(dt, A, B, C)[0]


@pytest.mark.parametrize("reduce", ["mean", "max"])
@pytest.mark.parametrize("n,cells,block", [(97, 10, 97 * 7), (97, 10, 97 * 25), (130, (7, 13), 130 * 3),
                                           (64, 64, 64 * 5), (150, 4, 150 * 11)])
def test_mamba_pooled_equals_dense(n, cells, block, reduce):
    k, dense = kept(n)
    cr, cc = (cells, cells) if isinstance(cells, int) else cells
    for h in range(4):
        re, ce = pool_edges(n, cr), pool_edges(n, cc)
        got = k.pooled(h, re, ce, reduce, slice(0, n), slice(0, n), block=block)
        want = dense_pool(dense[h], re, ce, reduce)
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), (h, (got - want).abs().max())


@pytest.mark.parametrize("reduce", ["mean", "max"])
def test_mamba_pooled_window_and_vanishing_decay(reduce):
    n = 211
    k, dense = kept(n, strong=40.0, seed=3)  # dt·A down to about -100 a token: exp(segsum) underflows to 0
    assert (dense == 0).float().mean() > 0.4 and torch.isfinite(dense).all()
    for rows, cols in [(slice(0, n), slice(0, n)), (slice(37, 190), slice(5, 120)), (slice(3, 50), slice(60, 200)),
                       (slice(100, 211), slice(0, 211))]:
        re = pool_edges(rows.stop - rows.start, 9)
        ce = pool_edges(cols.stop - cols.start, 11)
        for block in (7 * n, 60 * n):
            got = k.pooled(1, re, ce, reduce, rows, cols, block=block)
            assert torch.isfinite(got).all()
            want = dense_pool(dense[1, rows, cols], re, ce, reduce)
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), (rows, cols, (got - want).abs().max())


def test_cell_pool_signed_max_keeps_the_sign_and_zeros():
    a = torch.tensor([[-5.0, 1.0, 0.5, 0.0], [2.0, -0.1, 0.0, 0.0], [-1.0, -2.0, -3.0, 0.0]])
    pool = CellPool([0, 2, 3], [0, 2, 4], "max", slice(0, 3), slice(0, 4))
    pool.add(0, 1, a[0:1, :4])
    pool.add(1, 2, a[1:2, :2])  # its columns 2, 3 hidden (exactly 0)
    pool.add(2, 3, a[2:3, :4])
    assert pool.result().tolist() == [[-5.0, 0.5], [-2.0, -3.0]]
    with pytest.raises(ValueError):
        CellPool([0, 1], [0, 1], "sum", slice(0, 1), slice(0, 1))


def test_cell_pool_signed_max_over_tiles_and_bands_breaks_a_tie_for_the_positive():
    """A band pooled over its rows a tile of columns at a time (pool_rows into one array) and handed over once
    (add_rows), row cells straddling two bands, cells of unequal rows: the signed entry of largest magnitude is
    chosen across bands and tiles alike, a tie going to the positive entry in either order; the mean too."""
    a = torch.tensor([[-3.0, 1.0, 0.0, 2.0], [3.0, -1.0, -2.0, 0.5], [0.5, 0.25, 2.0, -4.0]], dtype=torch.float64)
    for order in ([(0, 1), (1, 3)], [(1, 3), (0, 1)]):
        for reduce in ("max", "mean"):
            pool = CellPool([0, 2, 3], [0, 1, 4], reduce, slice(0, 3), slice(0, 4))
            for r0, r1 in order:
                i0, i1 = pool.row_cells(r0, r1)[:2]
                band = [torch.empty(i1 - i0, 4, dtype=torch.float64) for _ in range(2 if reduce == "max" else 1)]
                for x, y in [(0, 3), (3, 4)]:  # tiles need not follow the cells
                    pool.pool_rows(r0, r1, a[r0:r1, x:y], [t[:, x:y] for t in band])
                pool.add_rows(r0, r1, *band)
            want = [[3.0, 2.0], [0.5, -4.0]] if reduce == "max" else \
                [[0.0, (1.0 + 0.0 + 2.0 - 1.0 - 2.0 + 0.5) / 6], [0.5, (0.25 + 2.0 - 4.0) / 3]]
            assert torch.allclose(pool.result().double(), torch.tensor(want, dtype=torch.float64)), (order, reduce)
