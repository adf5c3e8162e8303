"""glibc's malloc, told to keep a long forward's large freed blocks for the next layer (issue 24 A).

A layer of a long input allocates tensors of tens to hundreds of MB (Gemma 3 at 16,384 tokens: its MLP's
16,384 × 2,048 products). glibc serves every block above its mmap threshold (at most 32 MB, and 128 KB until a
first large free raises it) with a fresh mmap, and unmaps it when freed, so each layer's tensors are new pages
that the kernel must fault in and zero again: 3.6 million page faults and 7-10 s of system time in a 16 s
bfloat16 forward here (2 cores, Intel Xeon), with a worker thread's arena, which cannot grow past 64 MB, worse
than the main thread's.

`keep_large_blocks()` raises the mmap and trim thresholds to 1 GiB and pads the heap's growth by 64 MB
(process-wide, once), so freed blocks stay in the heap and the next layer reuses their pages: 0 faults in the
same forward, 11-13 s instead of 16-27 s in the same hour. `one_arena()` has every thread allocate from the main heap (called at start-up, before threads
exist: the GUI's forward runs on a worker thread). `give_back()` (malloc_trim) hands what the heap holds free
back to the system after a long run, as the session does after each one (session.memory).

No torch here: the GUI's process calls one_arena() before it loads anything. Elsewhere than glibc (macOS,
Windows, musl) each call does nothing and returns False.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8  # glibc's malloc.h
KEEP_BELOW = 1 << 30  # blocks up to this size come from (and go back to) the heap, not mmap
# the heap grows by this much beyond each request. Measured on 4 equal 40 MB blocks freed and asked for again:
# 40,960 page faults with the thresholds alone, 30,720 with this pad too (torch's 64-byte-aligned blocks want a few
# bytes more than the same block freed); a forward's mixed sizes reuse their blocks either way (0 faults)
TOP_PAD = 64 << 20
LONG_ROWS = 1024  # a forward of at least this many tokens is a long one (its blocks pass glibc's thresholds)

_LIBC: list = []  # glibc, once looked up (an empty entry: none here)
_KEPT: list = []  # keep_large_blocks() ran


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


def keep_large_blocks() -> bool:
    """Blocks below KEEP_BELOW are served from the heap and kept there when freed (until give_back). Once a
    process; True where glibc took the settings."""
    if _KEPT:
        return _KEPT[0]
    lib = _libc()
    ok = lib is not None and all(bool(lib.mallopt(option, value)) for option, value in (
        (M_MMAP_THRESHOLD, KEEP_BELOW), (M_TRIM_THRESHOLD, KEEP_BELOW), (M_TOP_PAD, TOP_PAD)))
    _KEPT.append(ok)
    return ok


def one_arena() -> bool:
    """Every thread allocates from the main heap, whose blocks keep_large_blocks() can keep at any size (a
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
