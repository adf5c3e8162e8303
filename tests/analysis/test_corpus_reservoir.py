"""The corpus view's reservoir (analysis.corpus._Reservoir, Vitter's algorithm R): over many seeded runs each
token of the stream is kept with probability k / n, whatever its place in the stream and however the stream is
cut into sentences. A reservoir that keeps the first k, or the last ones, or is off by one in its draw, fails.
"""
from __future__ import annotations

import numpy as np

from attn_explorer.analysis.corpus import _Reservoir

SENTENCES = [3, 7, 1, 5, 9, 2, 4, 6, 3]  # token counts: a stream of n = 40 tokens, cut unevenly
K, RUNS = 8, 4000
# chi-square with n - 1 = 39 degrees of freedom (k of n are kept in every run, so the counts sum to RUNS·k):
# scipy.stats.chi2.ppf(1 - 1e-4, 39) = 80.6. The seeds are fixed, so the test is deterministic; the bound
# says a correct reservoir passes it for all but 1 in 10,000 seed sets.
CHI2_39_P9999 = 80.6


def kept_tokens(seed: int) -> list[int]:
    """Run one reservoir over the stream, applying its (index, slot) answers; the stream positions kept."""
    pool = _Reservoir(K, seed=seed)
    slots: list[int] = []
    start = 0
    for n in SENTENCES:
        for i, slot in pool.offer(n):
            if slot == -1:
                slots.append(start + i)
            else:
                slots[slot] = start + i
        start += n
    return slots


def test_every_token_is_kept_with_probability_k_over_n():
    n = sum(SENTENCES)
    counts = np.zeros(n)
    for seed in range(RUNS):
        kept = kept_tokens(seed)
        assert len(kept) == K and len(set(kept)) == K  # k distinct tokens, every run
        counts[kept] += 1
    p = K / n  # 0.2
    expected, var = RUNS * p, RUNS * p * (1 - p)  # 800, sd 25.3
    chi2 = float(((counts - expected) ** 2 / var).sum() * (n - 1) / n)  # the multinomial's correction
    assert chi2 < CHI2_39_P9999, (chi2, counts)
    # and no single place is far off (binomial, 5 sd: 127 of 800): the first, the last, one cut between sentences
    assert np.abs(counts - expected).max() < 5 * np.sqrt(var), counts
    # the halves of the stream are kept alike (a reservoir biased to early or late tokens fails here first)
    first, second = counts[: n // 2].sum(), counts[n // 2:].sum()
    assert abs(first - second) < 5 * np.sqrt(2 * (n // 2) * var), (first, second)


def test_a_stream_shorter_than_the_reservoir_keeps_everything_in_order():
    pool = _Reservoir(50, seed=3)
    assert pool.offer(30) == [(i, -1) for i in range(30)]
    assert pool.offer(5) == [(i, -1) for i in range(5)]
