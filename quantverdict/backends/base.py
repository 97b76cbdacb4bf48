"""The backend interface: a :class:`Backend` says what it can run here and makes a :class:`Runner`.

Runners follow Polygraphy's shape: public ``activate/infer/deactivate`` wrap ``*_impl``
methods, and a runner is a context manager.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from quantverdict.cache import Cache
from quantverdict.capabilities import Capabilities
from quantverdict.models.spec import Batch, ModelSpec
from quantverdict.precision.base import Recipe


class Runner:
    name: str = "runner"

    def __enter__(self) -> "Runner":
        self.activate()
        return self

    def __exit__(self, *exc: object) -> None:
        self.deactivate()

    def activate(self) -> None:
        self.activate_impl()

    def infer(self, feed: Batch) -> dict[str, np.ndarray]:
        """Run one batch; outputs come back as float32/float64 host arrays, by name."""
        return self.infer_impl(feed)

    def deactivate(self) -> None:
        self.deactivate_impl()

    def label(self) -> str:
        """The runtime in words (name, version, mode), for messages that blame or clear it."""
        return self.name

    def describe(self) -> dict[str, Any]:
        """What the backend made, for the run record (e.g. an engine's per-layer precisions)."""
        return {}

    def activate_impl(self) -> None:
        pass

    def infer_impl(self, feed: Batch) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def deactivate_impl(self) -> None:
        pass


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

    def outputs_key(self, artifacts: Artifacts, caps: Capabilities) -> list[Any] | None:
        """Everything that decides this backend's outputs for ``artifacts`` on this machine (the
        runtime's version and settings, the exact model, the CPU), so they can be cached and a warm
        run reads them instead of running; None (the default) always runs: GPU kernels, engines
        built by autotuning, anything whose numbers this list could not pin down."""
        return None
