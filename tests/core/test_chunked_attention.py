"""Llama 4's chunked local attention (attention_chunk_size): a query sees only the keys of its own chunk,
causally; the chunks count from position 0, also when a KV cache holds the earlier positions."""
from __future__ import annotations

import pytest
import torch

from attn_explorer.core.masks import causal_mask, chunk_start, fold_mask


def brute(n: int, m: int, chunk: int) -> torch.Tensor:
    out = torch.zeros(n, m, dtype=torch.bool)
    for i in range(n):
        p = i + m - n
        for j in range(m):
            out[i, j] = j <= p and j // chunk == p // chunk
    return out


@pytest.mark.parametrize("n,m,chunk", [(11, 11, 4), (1, 9, 4), (3, 13, 5), (8, 8, 8), (7, 7, 1), (5, 12, 3)])
def test_the_chunked_mask_is_each_querys_own_chunk(n, m, chunk):
    assert torch.equal(causal_mask(n, m, chunk=chunk), brute(n, m, chunk))
    assert chunk_start(m - 1, chunk) == (m - 1) // chunk * chunk and chunk_start(m - 1, None) == 0


def test_a_chunk_folds_into_a_padding_mask_and_needs_causal():
    pad = torch.tensor([[True] * 6 + [False] * 3])[:, None, None, :]
    full = fold_mask(pad, True, 9, 9, chunk=4)
    assert torch.equal(full[0, 0], brute(9, 9, 4) & pad[0, 0])
    add = torch.zeros(1, 1, 1, 9).masked_fill(~pad, float("-inf"))
    assert torch.equal(torch.isfinite(fold_mask(add, True, 9, 9, chunk=4))[0, 0], full[0, 0])
    with pytest.raises(ValueError, match="causal"):
        fold_mask(None, False, 9, 9, chunk=4)
