"""Freed memory kept for reuse while the harness builds and evaluates graphs.

glibc's allocator hands a freed block above its thresholds (128 KiB at first, rising to at most 32 MiB as blocks
are freed) back to the kernel at once, so the next graph's temporaries of the same size fault every page in
again, and a page fault costs microseconds on a virtual machine. A recipe search allocates and frees graph-sized
buffers hundreds of times (a copy of the model per candidate and fold, its calibration activations, GPTQ's
matrices): MiniLM-L6's INT8 search made 31.7M page faults, 70 s of system time in 187 s (2-core AMD EPYC VM).
Kept (every block below 32 MiB from the heap, whose free memory is not returned while the work runs), the same
search took 151 s, 30 s of it in the kernel (11.8M faults), at 9% more peak memory (3.05 GB, was 2.79). What the
work kept is given back when it ends (``malloc_trim``). Other allocators (musl, macOS, Windows) are left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from contextlib import contextmanager
from typing import Iterator

# glibc's mallopt parameters (malloc.h), the values set while the work runs, and after it: glibc's own once its
# threshold has risen to its most (a block below 32 MiB from the heap, free heap above twice that returned)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
KEPT = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 8 << 30, M_TOP_PAD: 256 << 20}
AFTER = {M_TRIM_THRESHOLD: 64 << 20, M_TOP_PAD: 128 << 10}
# The same for processes the harness starts (glibc reads them at start; other C libraries ignore them)
WORKER_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": str(KEPT[M_MMAP_THRESHOLD]),
                      "MALLOC_TRIM_THRESHOLD_": str(KEPT[M_TRIM_THRESHOLD]), "MALLOC_TOP_PAD_": str(KEPT[M_TOP_PAD])}
_depth = [0]  # kept() within kept() (a search within a case) sets and restores once


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") and hasattr(libc, "gnu_get_libc_version") \
        else None


@contextmanager
def kept() -> Iterator[None]:
    """Within: freed memory is reused rather than returned and faulted in again. After: the free heap is returned,
    and what is freed later (the user's own code in the same process) is returned as glibc would."""
    libc = _glibc()
    if libc is not None and _depth[0] == 0:
        for parameter, value in KEPT.items():
            libc.mallopt(parameter, value)
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if libc is not None and _depth[0] == 0:
            for parameter, value in AFTER.items():
                libc.mallopt(parameter, value)
            libc.malloc_trim(0)
