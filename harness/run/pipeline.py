"""A run's shared state, put together: the model registry, backends, capabilities, tolerance
table, the :class:`ArtifactStore` and the :class:`CaseExecutor`.

The CLI and the pytest plugin both enumerate with :meth:`Pipeline.cases` and run with
:meth:`Pipeline.run`; what each step does lives in ``cases``, ``artifacts`` and ``execute``.
"""
from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

from harness.backends import Backend, backend_registry
from harness.cache import Cache
from harness.capabilities import Capabilities, detect
from harness.judge.tolerances import ToleranceTable
from harness.models import ModelSpec, model_registry
from harness.precision.calibrators import Calibrator
from harness.registry import Registry
from harness.run.artifacts import ArtifactStore
from harness.run.cases import Case, CaseResult, enumerate_cases
from harness.run.execute import CaseExecutor

__all__ = ["Case", "CaseResult", "Pipeline"]


class Pipeline:
    def __init__(self, cache_dir: Path, tolerances: Path | None = None, manifest: Path | None = None,
                 capabilities: Capabilities | None = None, calibration: str | None = None, timing: bool = False):
        self.cache = Cache(cache_dir)
        self.tolerances = ToleranceTable.load(tolerances)
        self.models: Registry[ModelSpec] = model_registry(manifest)
        self.backends: Registry[type[Backend]] = backend_registry()
        self.caps = capabilities or detect()
        self.store = ArtifactStore(self.cache, self.models, self.backend,
                                   Calibrator(calibration) if calibration else None)
        self.executor = CaseExecutor(self.store, self.tolerances, self.backend, timing)

    def cases(self, models: list[str] | None = None, precisions: list[str] | None = None,
              backends: list[str] | None = None) -> list[Case]:
        """Every model × precision × backend combination the backends offer (validated names)."""
        model_names = models or self.models.names()
        for name in model_names:
            self.models.get(name)
        return enumerate_cases(model_names, backends or self.backends.names(),
                               lambda name: self.backend(name).precisions, precisions)

    @functools.lru_cache(maxsize=None)
    def backend(self, name: str) -> Backend:
        return self.backends.get(name)()

    def skip_reason(self, case: Case) -> str | None:
        """The case's own requirement first (a GPU too old for FP4 says so even where the backend's
        package is missing too), then the backend's."""
        backend = self.backend(case.backend)
        return backend.requirement(self.models.get(case.model), case.precision, self.caps) or \
            backend.unavailable(self.caps)

    def run(self, case: Case) -> CaseResult:
        """Run one case (or skip it with the requirement that failed), counting its cache use."""
        reason = self.skip_reason(case)
        if reason:
            return CaseResult(case, "skipped", reason)
        before = Counter(self.cache.stats)
        result = self.executor.run(case)
        result.cache = dict(Counter(self.cache.stats) - before)  # this case's cache hits and misses
        return result
