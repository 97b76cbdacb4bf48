"""Stage 4's loader, lazy: a backend's outputs over batches, and the label of the runtime that made them.

Read from the cache where the backend can name everything that decides its numbers
(:meth:`Backend.outputs_key`: the runtime's version and settings, the exact graph, the CPU), else run:
GPU kernels and autotuned engines are always run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from quantverdict.backends.base import Artifacts, Backend, infer_all
from quantverdict.backends.samples import CODE as JOINING
from quantverdict.cache import Cache
from quantverdict.capabilities import Capabilities
from quantverdict.hashing import source_fingerprint
from quantverdict.models.spec import Batch


@dataclass(frozen=True)
class RuntimeOutputs:
    backend: Backend
    artifacts: Artifacts
    batches: Callable[[], list[Batch]]
    batches_key: Callable[[], str]
    caps: Capabilities
    cache: Cache

    def __call__(self) -> tuple[dict[str, np.ndarray], str]:
        parts = self.backend.outputs_key(self.artifacts, self.caps)
        if parts is None:
            return self._run()
        describe = {"model": self.artifacts.spec.name, "backend": self.backend.name,
                    "precision": self.artifacts.recipe.name}
        layout = source_fingerprint(JOINING)  # how batches' outputs are joined
        return self.cache.arrays("outputs", [parts, self.batches_key(), layout], self._run, describe)

    def _run(self) -> tuple[dict[str, np.ndarray], str]:
        with self.backend.load(self.artifacts) as runner:
            return infer_all(runner, self.batches()), runner.label()
