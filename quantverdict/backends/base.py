"""The backend interface: a :class:`Backend` says what it can run here and makes a :class:`Runner`.

Runners follow Polygraphy's shape: public ``activate/infer/deactivate`` wrap ``*_impl``
methods, and a runner is a context manager.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from quantverdict.backends.samples import joined
from quantverdict.cache import Cache
from quantverdict.capabilities import Capabilities
from quantverdict.models.spec import Batch, ModelSpec
from quantverdict.precision.base import Recipe


BUILD_OPTIONS = "build_options"  # in a runner's description: what its engine was built with (flags, shapes, GPU)
ENGINE_PLAN = "engine_plan"  # ... and the sha256 of the engine it runs: the tactics its build chose (timing cache)


class Runner:
    """Activated, runs batches; a context manager. Running an inactive runner, or activating an active one, is
    an error (a runner's session or engine exists only between ``activate`` and ``deactivate``)."""

    name: str = "runner"
    is_active: bool = False

    def __enter__(self) -> "Runner":
        self.activate()
        return self

    def __exit__(self, *exc: object) -> None:
        self.deactivate()

    def activate(self) -> None:
        if self.is_active:
            raise RuntimeError(f"{self.name} runner activated twice")
        self.activate_impl()
        self.is_active = True

    def infer(self, feed: Batch) -> dict[str, np.ndarray]:
        """Run one batch; outputs come back as float32/float64 host arrays, by name."""
        if not self.is_active:
            raise RuntimeError(f"{self.name} runner used before activate() (use it as a context manager)")
        return self.infer_impl(feed)

    def deactivate(self) -> None:
        if self.is_active:
            self.deactivate_impl()
            self.is_active = False

    def label(self) -> str:
        """The runtime in words (name, version, mode), for messages that blame or clear it."""
        return self.name

    def describe(self) -> dict[str, Any]:
        """What the backend made, for the run record (e.g. an engine's per-layer precisions; under
        :data:`BUILD_OPTIONS`, what an engine was built with, which the case's fingerprint keys)."""
        return {}

    def activate_impl(self) -> None:
        pass

    def infer_impl(self, feed: Batch) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def deactivate_impl(self) -> None:
        pass


class Infers(Protocol):
    """Anything that runs a batch: our runners, and Polygraphy's ``TrtRunner``."""

    def infer(self, feed: Batch) -> dict[str, np.ndarray]: ...


def infer_all(runner: Infers, batches: Sequence[Batch]) -> dict[str, np.ndarray]:
    """Every batch run by an active ``runner`` (ours, or Polygraphy's ``TrtRunner``), each output joined sample by
    sample (:func:`~quantverdict.backends.samples.joined`)."""
    return joined([runner.infer(batch) for batch in batches], batches)


@dataclass(frozen=True)
class Artifacts:
    """What the pipeline made for one case; each callable builds (or loads from cache) on demand."""

    spec: ModelSpec
    recipe: Recipe
    module: Callable[[], Any] | None
    onnx_path: Callable[[], Path]  # the recipe's graph
    fp32_onnx: Callable[[], Path]  # the exported FP32 graph (TensorRT 10's weakly typed path)
    # calibrated activation ranges (implicit INT8); None where the graph is more than the FP32 graph plus
    # ranges (a user's own quantized graph, a recipe that rewrites the graph or chooses weights)
    ranges: Callable[[], dict[str, float]] | None
    calibration_batches: Callable[[], list[Batch]]
    cache: Cache
    coverage: Callable[[], dict[str, Any]] | None = None  # the recipe graph's quantized layers (quantized precisions)


@dataclass
class Diagnosis:
    """What a backend can say about where its outputs left the graph's semantics: notes for the person
    reading the failure, and the located divergence (for the record), if it can locate one."""

    notes: list[str] = field(default_factory=list)
    divergence: dict[str, Any] | None = None


class Backend:
    """One execution backend: which precisions it offers and what it needs to offer them."""

    name: str = ""
    precisions: frozenset[str] = frozenset()
    gpu_precisions: frozenset[str] = frozenset()  # offered only where a GPU runs them (marker `gpu`)
    recipe_target: str = "emulated"  # which variant of a recipe's graph it executes (Recipe.for_target)
    runs_recipe_graph: bool = True  # it executes the precision graph, so its fidelity to the graph is judged

    def unavailable(self, caps: Capabilities) -> str | None:
        """Why this backend cannot run at all here (a missing package), or None."""
        return None

    def requirement(self, spec: ModelSpec, precision: str, caps: Capabilities) -> str | None:
        """Why this case cannot run here, or None."""
        return None

    def load(self, artifacts: Artifacts) -> Runner:
        """A runner for the case; math modes such as TF32 come from ``artifacts.recipe.runtime``."""
        raise NotImplementedError

    def coverage(self, artifacts: Artifacts) -> dict[str, Any] | None:
        """Which weighted layers this backend runs in the quantized precision and which in float: the recipe
        graph's (:func:`quantverdict.precision.coverage.layer_coverage`) for a backend that runs it, its own
        for a backend that chooses its layers; None for a precision that quantizes nothing."""
        return None if artifacts.coverage is None else artifacts.coverage()

    def diagnose(self, artifacts: Artifacts, batch: Batch, bound: float, caps: Capabilities,
                 say: Callable[[str], None] | None = None) -> Diagnosis:
        """Why and where this backend's outputs left the precision graph's semantics (``bound``: the largest
        fraction of rounding decisions a faithful runtime may flip), after its fidelity failed, ``say`` telling the
        run's progress what a long search for it does; most backends cannot say more than the verdict does."""
        return Diagnosis()

    def outputs_key(self, artifacts: Artifacts, caps: Capabilities) -> list[Any] | None:
        """Everything that decides this backend's outputs for ``artifacts`` on this machine (the
        runtime's version and settings, the exact model, the CPU), so they can be cached and a warm
        run reads them instead of running; None (the default) always runs: GPU kernels, engines
        built by autotuning, anything whose numbers this list could not pin down."""
        return None
