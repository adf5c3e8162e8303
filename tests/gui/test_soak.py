"""2,000 live grid updates: no crash, and memory stays bounded."""
from __future__ import annotations

import gc

import numpy as np

from attn_explorer.api.display import grid_image
from attn_explorer.api.result import RunResult


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _synthetic(rng, n: int) -> RunResult:
    logits = rng.standard_normal((6, 12, n, n)).astype(np.float32)
    att = np.exp(logits)
    att /= att.sum(-1, keepdims=True)
    special = np.zeros(n, bool)
    special[[0, -1]] = True
    return RunResult(attentions=att, tokens=[f"t{i}" for i in range(n)], special=special, model="textbook",
                     dk_scale=1.0, forward_ms=1.0)


def test_grid_survives_2000_live_updates_with_bounded_memory(make_window, qtbot):
    w = make_window(model="textbook", view="grid")
    st = w.state
    rng = np.random.default_rng(0)
    pool = [_synthetic(rng, n) for n in (8, 16, 24, 32)]
    grids = [grid_image(r.attentions) for r in pool]  # the session's worker pools these with the run
    painted = []
    w.frame_painted.connect(painted.append)

    def push(k):
        r = pool[k % len(pool)]
        st.result = r
        st.grid_image = grids[k % len(pool)]
        st.ready_at = 0.0
        st.attention_ready.emit(r)
        if k % 10 == 0:
            qtbot.wait(1)  # let paints happen, as the event loop would between keystrokes

    for k in range(200):
        push(k)
    gc.collect()
    base = _rss_mib()
    for k in range(200, 2000):
        push(k)
    gc.collect()
    grown = _rss_mib() - base
    assert grown < 40, f"memory grew {grown:.1f} MiB over 1,800 updates"
    assert w.grid.last_image.shape == (6 * 32, 12 * 32)
    assert len(painted) > 50  # the grid really repainted along the way
