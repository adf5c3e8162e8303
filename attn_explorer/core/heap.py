"""glibc's malloc, told to keep a long forward's large freed blocks for the next layer (issue 24 A).

A layer of a long input allocates tensors of tens to hundreds of MB (Gemma 3 at 16,384 tokens: its MLP's
16,384 × 2,048 products). glibc serves every block above its mmap threshold (at most 32 MB, and 128 KB until a
first large free raises it) with a fresh mmap, and unmaps it when freed, so each layer's tensors are new pages
that the kernel must fault in and zero again: 3.6 million page faults and 7-10 s of system time in a 16 s
bfloat16 forward here (2 cores, Intel Xeon), with a worker thread's arena, which cannot grow past 64 MB, worse
than the main thread's.

`large_blocks_kept()`, around a long forward, raises the mmap and trim thresholds to 1 GiB and pads the heap's
growth by 64 MB, so freed blocks stay in the heap and the next layer reuses their pages: 0 faults in the same
forward, 11-13 s instead of 16-27 s in the same hour. On leaving it puts fixed thresholds of glibc's own order back
(AFTER: 32 MB mmap, 64 MB trim, no pad) and hands what the heap holds free back to the system.

glibc's dynamic threshold, once set by hand, stays off for the process, and with fixed thresholds the heap of many
short runs of varied length fragments: after 300 runs on MKL's product, VmRSS grew 24-37 MB every 1,000 MiniLM
runs here with fixed thresholds of 8-32 MB, 47 MB with the 1 GiB ones kept, 0-8 MB with glibc's dynamic ones;
275 MB over the 10,000 runs of CI's soak (tests/api/test_soak_lengths.py), late in the whole suite's process
(benchmarks/bench_heap_soak.py, with another process history, saw no growth in any setting: it depends on the
heap's past). So `tidy()`, after every CPU forward, trims at most once every TIDY_EVERY_S seconds; trimming after
every run, the same 1,000 runs ended 30 MB smaller, for about 6 ms a trim.

`one_arena()` has every thread allocate from the main heap (called at start-up, before threads exist: the GUI's
forward runs on a worker thread). `give_back()` (malloc_trim) hands what the heap holds free back to the system
(session.memory, at a load).

No torch here: the GUI's process calls one_arena() before it loads anything. Elsewhere than glibc (macOS,
Windows, musl) each call does nothing and returns False.
"""
from __future__ import annotations

import ctypes
import sys
import threading
import time
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8  # glibc's malloc.h
KEEP_BELOW = 1 << 30  # blocks up to this size come from (and go back to) the heap, not mmap
# the heap grows by this much beyond each request. Measured on 4 equal 40 MB blocks freed and asked for again:
# 40,960 page faults with the thresholds alone, 30,720 with this pad too (torch's 64-byte-aligned blocks want a few
# bytes more than the same block freed); a forward's mixed sizes reuse their blocks either way (0 faults)
TOP_PAD = 64 << 20
# put back after a long forward: glibc's dynamic mmap threshold stops at 32 MB on 64-bit, its trim threshold at twice it
AFTER = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 64 << 20), (M_TOP_PAD, 0))
KEEP = ((M_MMAP_THRESHOLD, KEEP_BELOW), (M_TRIM_THRESHOLD, KEEP_BELOW), (M_TOP_PAD, TOP_PAD))
TIDY_EVERY_S = 2.0  # tidy() trims at most this often
LONG_ROWS = 1024  # a forward of at least this many tokens is a long one (its blocks pass glibc's thresholds)

_LIBC: list = []  # glibc, once looked up (an empty entry: none here)
_INSIDE = [0]  # large_blocks_kept() contexts open now (threads may overlap)
_LOCK = threading.Lock()
_TIDIED = [0.0]  # time.monotonic() of tidy()'s last trim


def _libc():
    if not _LIBC:
        lib = None
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL("libc.so.6")
                lib.mallopt.argtypes, lib.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
                lib.malloc_trim.argtypes, lib.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):
                lib = None
        _LIBC.append(lib)
    return _LIBC[0]


def _set(settings) -> bool:
    lib = _libc()
    return lib is not None and all(bool(lib.mallopt(option, value)) for option, value in settings)


@contextmanager
def large_blocks_kept():
    """Inside it, blocks below KEEP_BELOW are served from the heap and kept there when freed; on leaving the last
    one open, the thresholds of AFTER are put back and the free memory goes back to the system. Yields True where
    glibc took the settings."""
    with _LOCK:
        _INSIDE[0] += 1
        ok = _set(KEEP)
    try:
        yield ok
    finally:
        with _LOCK:
            _INSIDE[0] -= 1
            if ok and not _INSIDE[0]:
                _set(AFTER)
                give_back()
                _TIDIED[0] = time.monotonic()  # the forward's own tidy() right after has nothing to trim again


def one_arena() -> bool:
    """Every thread allocates from the main heap, whose blocks large_blocks_kept() can keep at any size (a
    thread's own arena maps anything past 64 MB anew). Only threads that have not allocated yet follow it, so
    call it at start-up."""
    lib = _libc()
    return lib is not None and bool(lib.mallopt(M_ARENA_MAX, 1))


def give_back() -> bool:
    """Hand the memory malloc holds free back to the system (malloc_trim(0), every arena)."""
    lib = _libc()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True


def tidy(now: float | None = None) -> bool:
    """give_back() if the last tidy() that trimmed was at least TIDY_EVERY_S ago; True if it trimmed."""
    now = time.monotonic() if now is None else now
    if now - _TIDIED[0] < TIDY_EVERY_S:
        return False
    _TIDIED[0] = now
    return give_back()
