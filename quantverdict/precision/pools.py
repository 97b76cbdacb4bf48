"""The thread pools of the libraries a recipe search calls (numpy's BLAS; torch's OpenMP and the BLAS under it), held
small while it runs: its matrix operations are many and small (GPTQ's column blocks, H's products), and pools of every
core wait busily between them. On a 16-core Xeon, the benchmark's MobileNetV2 lock took 151–161 CPU-s with pools of
16 and 102 with pools of 2, the 35M encoder's search 343 and 240, each at the same wall time (32–35 s, 98 s) with the
same choices and scores. ONNX Runtime's own pool is not one of them (the harness sizes it per session)."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from threadpoolctl import threadpool_limits

SEARCH_THREADS = 2
_SEARCHES: list[list["threadpool_limits"]] = []  # each search running: the limits of pools loaded since it began


@contextmanager
def small_pools() -> Iterator[None]:
    """numpy's BLAS and the OpenMP pools at :data:`SEARCH_THREADS` threads while inside, as they were after
    (``threadpoolctl``), and torch's where it loads inside (:func:`loaded_torch`)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=SEARCH_THREADS):
        _SEARCHES.append([])
        try:
            yield
        finally:
            for limits in reversed(_SEARCHES.pop()):
                limits.restore_original_limits()


def loaded_torch() -> ModuleType:
    """torch, imported where it is not yet: where a search runs, its pools are then held small with the others
    (a library loaded inside :func:`small_pools` is past the limits it set). Loaded for the search's GPTQ alone, not
    before every search: a check that finds everything cached imported it for nothing (1.7 s of its 3 s)."""
    new = "torch" not in sys.modules
    import torch

    if new and _SEARCHES:
        from threadpoolctl import threadpool_limits

        _SEARCHES[-1].append(threadpool_limits(limits=SEARCH_THREADS))
    return torch
