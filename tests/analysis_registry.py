"""What the tests of your own analyses share: the registry put back as it was, and the README's example."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from attn_explorer.api import analyses as reg


@contextmanager
def registry_kept(empty: bool = False):
    """The registry as it was found (entry points read), put back afterwards; empty=True: nothing registered
    while inside, so a test sees only what it registers."""
    reg.load_entry_points()
    before = dict(reg._registry)
    if empty:
        with reg._lock:
            reg._registry.clear()
    try:
        yield
    finally:
        with reg._lock:
            reg._registry.clear()
            reg._registry.update(before)


def prev_token(r):
    """Per layer and head: the mean weight of rows i >= 1 on token i - 1 (the README's example)."""
    i = np.arange(1, r.attentions.shape[-1])
    return r.attentions[:, :, i, i - 1].mean(-1)
