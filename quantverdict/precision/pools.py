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
    """A search running: the limits of the pools loaded since it began, and whether torch's are held small."""

    torch_held: bool
    limits: list["threadpool_limits"] = field(default_factory=list)


_SEARCHES: list[_Search] = []


@contextmanager
def small_pools() -> Iterator[None]:
    """numpy's BLAS and the OpenMP pools at :data:`SEARCH_THREADS` threads while inside, as they were after
    (``threadpoolctl``), and torch's where it loads inside (:func:`loaded_torch`)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=SEARCH_THREADS):
        _SEARCHES.append(_Search(_imported("torch")))
        try:
            yield
        finally:
            for limits in reversed(_SEARCHES.pop().limits):
                limits.restore_original_limits()


def torch_ahead() -> None:
    """torch imported in a thread of its own where it is not yet, for a search whose GPTQ will ask for it: its
    import (2.1 s of a 17 s ``lock --check`` on 2 cores) then runs beside the search's first ONNX Runtime passes,
    which release the GIL, and :func:`loaded_torch` waits for what is left of it (Python's import lock)."""
    if "torch" not in sys.modules:
        threading.Thread(target=importlib.import_module, args=("torch",), name="quantverdict-torch-import",
                         daemon=True).start()


def loaded_torch() -> ModuleType:
    """torch, imported where it is not yet: where a search runs, its pools are then held small with the others
    (a library loaded inside :func:`small_pools` is past the limits it set). Loaded for the search's GPTQ alone, not
    before every search: a check that finds everything cached imported it for nothing (1.7 s of its 3 s)."""
    import torch

    if _SEARCHES and not _SEARCHES[-1].torch_held:  # loaded since the search began (here or by torch_ahead's thread)
        from threadpoolctl import threadpool_limits

        _SEARCHES[-1].limits.append(threadpool_limits(limits=SEARCH_THREADS))
        _SEARCHES[-1].torch_held = True
    return torch


def _imported(name: str) -> bool:
    """Whether the module ``name`` is imported whole (not still being imported by another thread)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)
