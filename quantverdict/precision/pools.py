"""The thread pools of the libraries a recipe search calls (numpy's BLAS; torch's OpenMP and the BLAS under it), held
small while it runs: its matrix operations are many and small (GPTQ's column blocks, H's products), and pools of every
core wait busily between them. On a 16-core Xeon, the benchmark's MobileNetV2 lock took 151–161 CPU-s with pools of
16 and 102 with pools of 2, the 35M encoder's search 343 and 240, each at the same wall time (32–35 s, 98 s) with the
same choices and scores. ONNX Runtime's own pool is not one of them (the harness sizes it per session)."""
from __future__ import annotations

import importlib
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from threadpoolctl import threadpool_limits

SEARCH_THREADS = 2


@dataclass
class _Search:
    """A search running: the limits of the pools loaded since it began, and whether torch was loaded before it (then
    the limits it set at its start hold torch's pools) or its pools are held since."""

    limits: list["threadpool_limits"] = field(default_factory=list)
    torch_before: bool = field(default_factory=lambda: "torch" in sys.modules)
    torch_held: bool = False


_SEARCHES: list[_Search] = []


@contextmanager
def small_pools() -> Iterator[None]:
    """numpy's BLAS and the OpenMP pools at :data:`SEARCH_THREADS` threads while inside, as they were after
    (``threadpoolctl``), and torch's where it loads inside (:func:`loaded_torch`)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=SEARCH_THREADS):
        _SEARCHES.append(_Search())
        try:
            yield
        finally:
            for limits in reversed(_SEARCHES.pop().limits):
                limits.restore_original_limits()


def loaded_torch() -> ModuleType:
    """torch, imported where it is not yet: where a search runs, its pools are then held small with the others
    (a library loaded inside :func:`small_pools` is past the limits it set), by the thread that computes with it. Loaded
    for the search's GPTQ alone, not before every search: a check that finds everything cached imported it for nothing
    (1.7 s of its 3 s)."""
    import torch

    search = _SEARCHES[-1] if _SEARCHES else None
    if search is not None and not search.torch_before and not search.torch_held:
        from threadpoolctl import threadpool_limits

        search.torch_held = True
        search.limits.append(threadpool_limits(limits=SEARCH_THREADS))
    return torch


def prefetch_torch() -> None:
    """torch imported on a thread of its own, from now on, for a search whose GPTQ will compute with it: its import
    (1.3-1.6 s on a 2-core EPYC) then runs beside the search's start and ONNX Runtime's passes, not inside the first
    pass, whose H needs it (that pass of MobileNetV2's took 6.9 s with the import, 5.4 s without; its lock's first
    candidate 9 s, then 7-8 s). :func:`loaded_torch` waits for it where it has not ended, and holds its pools small."""
    if "torch" not in sys.modules:
        threading.Thread(target=importlib.import_module, args=("torch",), name="quantverdict-torch-import",
                         daemon=True).start()
