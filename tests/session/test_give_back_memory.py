"""Issue 24 D, memory: what a model switch frees goes back to the system. glibc's malloc keeps freed blocks for
reuse: after MiniLM -> SmolLM2 -> Gemma the process stayed hundreds of MiB above Gemma's run alone. A load, once
the old model and its runs are collected (session.jobs.drop_kept_prefix), calls session.memory.give_back_freed
(malloc_trim(0))."""
from __future__ import annotations

import sys
import weakref

import numpy as np
import pytest

from attn_explorer.session import memory

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")


def _rss_mib() -> float:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@linux
def test_freed_blocks_go_back_to_the_system():
    blocks = [np.ones(60_000 // 8) for _ in range(3000)]  # ~170 MiB of blocks under malloc's mmap threshold
    keep = [blocks[i] for i in range(0, len(blocks), 500)] + [np.ones(10)]  # a few stay: the heap cannot shrink
    del blocks
    held = _rss_mib()
    assert memory.give_back_freed()
    back = held - _rss_mib()
    assert back > 100, f"only {back:.0f} MiB went back"
    del keep


def test_a_load_gives_back_what_the_old_model_freed(monkeypatch):
    import gc

    from attn_explorer.session import jobs

    order = []
    monkeypatch.setitem(sys.modules, "attn_explorer.api.prefix", type(sys)("prefix"))  # a model ran
    sys.modules["attn_explorer.api.prefix"].kept_tokens = lambda: 0
    monkeypatch.setattr(gc, "collect", lambda *a: order.append(("collect", *a)) or 0)
    monkeypatch.setattr(memory, "give_back_freed", lambda: order.append("give back") or True)

    class Old:  # the model the load let go, held by a reference cycle: only a full collection frees it
        pass

    held = Old()
    jobs.drop_kept_prefix(old=weakref.ref(held))
    assert order == [("collect",), "give back"]  # after the collection that frees the old model


def test_a_load_whose_old_model_is_already_gone_pays_no_full_collection(monkeypatch):
    """A model is freed by its last reference (no cycle holds it): the load then collects the young generations
    only. A full collection took 5-7 s a load late in the test suite's big process here (0.2 s in the app's),
    and a third of the suite's time."""
    import gc

    from attn_explorer.session import jobs

    order = []
    monkeypatch.setitem(sys.modules, "attn_explorer.api.prefix", type(sys)("prefix"))
    sys.modules["attn_explorer.api.prefix"].kept_tokens = lambda: 0
    monkeypatch.setattr(gc, "collect", lambda *a: order.append(("collect", *a)) or 0)
    monkeypatch.setattr(memory, "give_back_freed", lambda: order.append("give back") or True)

    class Old:
        pass

    gone = Old()
    ref = weakref.ref(gone)
    del gone
    jobs.drop_kept_prefix(old=ref)
    jobs.drop_kept_prefix()  # nothing was let go (the first load, or a pinned model)
    assert order == [("collect", 1), "give back", ("collect", 1), "give back"]


def test_a_long_run_gives_back_its_temporaries(monkeypatch, tmp_path):
    """A lazy run's forward frees its tiles and activations as it ends: they go back too, once the run is done
    (a dense, short run is left alone: typing runs it at every keystroke)."""
    pytest.importorskip("transformers")
    import attn_explorer as ax
    from attn_explorer.session.jobs import run_job
    from tests.tiny_llama import make_llama_folder

    m = ax.load_model(str(make_llama_folder(tmp_path / "m")), device="cpu")
    calls = []
    monkeypatch.setattr(memory, "give_back_freed", lambda: calls.append(1) or True)
    run_job(m, "The capital of France is Paris.", {})
    assert calls == []
    run_job(m, "The capital of France is Paris, and of Spain Madrid.", {"lazy": True})
    assert calls == [1]
