"""The thread pools of the libraries a recipe search calls (numpy's BLAS, torch's OpenMP and the BLAS under it), held
small while it runs: its matrix operations are many and small (GPTQ's column blocks, H's products), and pools of
every core wait busily between them. On a 16-core Xeon, the benchmark's MobileNetV2 lock took 151–161 CPU-s with
pools of 16 and 102 with pools of 2, the 35M encoder's search 343 and 240, each at the same wall time (32–35 s, 98 s)
with the same choices and scores. ONNX Runtime's own pool is not one of them (the harness sizes it per session)."""
from __future__ import annotations

import importlib.util
import sys
from contextlib import contextmanager
from typing import Iterator

SEARCH_THREADS = 2


@contextmanager
def small_pools() -> Iterator[None]:
    """numpy's BLAS and the OpenMP pools at :data:`SEARCH_THREADS` threads while inside, as they were after
    (``threadpoolctl``). torch is loaded first where it is installed and not yet loaded: a library loaded inside is
    past the limits' reach, and a search's GPTQ loads it."""
    from threadpoolctl import threadpool_limits

    if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        importlib.import_module("torch")  # its OpenMP pool, to be limited with the rest
    with threadpool_limits(limits=SEARCH_THREADS):
        yield
