"""Issue 24 A: a long forward's large freed blocks are kept for the next layer (core.heap), not unmapped and
faulted in again. Each case runs in a fresh interpreter, whose malloc settings no other test has touched."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")

_FAULTS = textwrap.dedent("""
    import resource, sys, threading
    import torch
    from attn_explorer.core import heap
    if "arena" in sys.argv: heap.one_arena()
    kept = heap.large_blocks_kept()  # held open to the end (a dropped generator would close it)
    if "keep" in sys.argv: kept.__enter__()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(256, 1024, generator=g) / 16, torch.randn(1024, 256, generator=g) / 32
    out = []
    def forward(x):  # a stack of MLP blocks whose activations are tens of MB, as a long input's layers
        for _ in range(4):
            h = torch.nn.functional.gelu(x @ w1)
            x = x + torch.nn.functional.layer_norm(h @ w2, (256,))
        return x
    def work():
        x = torch.randn(10_000, 256, generator=g)
        forward(x)  # the first forward maps its pages in any case
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        forward(x)
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
    if "thread" in sys.argv:
        t = threading.Thread(target=work); t.start(); t.join()
    else:
        work()
    print(out[0])
""")


def _faults(*flags: str) -> int:
    done = subprocess.run([sys.executable, "-c", _FAULTS, *flags], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


PAGES = 4 * 10_000 * 1024 * 4 // 4096  # the pages of one 40 MB activation a layer


@linux
@pytest.mark.parametrize("where", ["main", "thread"])
def test_kept_blocks_are_reused_without_faulting_their_pages_in_again(where):
    flags = ("thread", "arena") if where == "thread" else ()
    default = _faults(*flags)
    assert default > 2 * PAGES  # glibc's default: each layer's large blocks are fresh mmaps, faulted in anew
    assert _faults("keep", *flags) < default / 4  # measured: 2,500 against 92,000 (main), 20,000 against 90,000


_AFTER = textwrap.dedent("""
    import sys
    import torch
    from attn_explorer.core import heap
    def rss():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    with heap.large_blocks_kept() as ok:
        assert ok
        x = torch.ones(50 << 18)  # 50 MB from the heap, kept there when freed
        del x
    base = rss()
    x = torch.ones(50 << 18)
    grown = rss() - base
    del x
    print(grown, rss() - base)
""")


@linux
def test_after_a_long_forward_large_blocks_go_back_to_the_system():
    done = subprocess.run([sys.executable, "-c", _AFTER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    grown, left = map(float, done.stdout.split())
    assert grown > 40  # the block was really there
    assert left < 5  # 50 MB freed after the long forward: unmapped, not kept by a 1 GiB trim threshold for the
    # process's life (kept, the heap of 10,000 short runs of varied length fragmented: +275 MB in CI's soak)


@linux
def test_a_long_cpu_forward_keeps_large_blocks_and_a_short_one_does_not(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from contextlib import contextmanager

    import attn_explorer as ax
    from attn_explorer.core import heap
    from tests.tiny_llama import make_llama_folder

    calls = []

    @contextmanager
    def kept():
        calls.append("keep")
        yield True
        calls.append("put back")

    monkeypatch.setattr(heap, "large_blocks_kept", kept)
    monkeypatch.setattr(heap, "LONG_ROWS", 40)
    m = ax.load_model(str(make_llama_folder(tmp_path / "llama")), device="cpu")
    m.run("a short one")
    assert calls == []
    m.run(" ".join(["word"] * 60), lazy=True)
    assert calls == ["keep", "put back"]  # the settings and what the forward freed go back after it (a bfloat16
    # run's blocks kept for a float32 run of twice their size had raised a benchmark's peak by 3 GB)


def test_tidy_trims_at_most_once_every_few_seconds(monkeypatch):
    from attn_explorer.core import heap

    trims = []
    monkeypatch.setattr(heap, "give_back", lambda: trims.append(1) or True)
    monkeypatch.setattr(heap, "_TIDIED", [0.0])
    t = 1000.0
    assert heap.tidy(t) and trims == [1]
    assert not heap.tidy(t + heap.TIDY_EVERY_S / 2) and trims == [1]  # a trim costs ~6 ms: not after every short run
    assert heap.tidy(t + heap.TIDY_EVERY_S) and trims == [1, 1]
    trims.clear()
    with heap.large_blocks_kept():  # leaving it trims (where glibc is), and counts as tidy()'s latest trim
        pass
    assert not heap.tidy() and len(trims) <= 1  # a long forward's own tidy() does not trim a second time


def test_every_cpu_run_tidies_the_heap(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import attn_explorer as ax
    from attn_explorer.core import heap
    from tests.tiny_llama import make_llama_folder

    m = ax.load_model(str(make_llama_folder(tmp_path / "llama")), device="cpu")
    calls = []
    monkeypatch.setattr(heap, "tidy", lambda: calls.append(1) or False)
    m.run("a short one")
    m.run("another short one", lazy=True)
    assert calls == [1, 1]  # fixed malloc thresholds (after a long forward) had let 10,000 short runs fragment
    # the heap by 275 MB in CI's soak


def test_start_up_puts_every_thread_on_one_heap(monkeypatch):
    from attn_explorer.cli import main as cli
    from attn_explorer.core import heap

    calls = []
    monkeypatch.setattr(heap, "one_arena", lambda: calls.append(1) or True)
    assert cli.main(["cost", "--bogus-option"]) == 2  # a usage error returns before start-up
    assert calls == []
    cli.main(["export", "--model", "no-such-model-here", "--text", "x", "--out", "/nonexistent/x.npz"])
    assert calls == [1]
