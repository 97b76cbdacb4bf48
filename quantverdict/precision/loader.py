"""Stage 3's loader, lazy and cached: the graph for a precision, from the FP32 graph (at the recipe's
opset), the recipe and the calibration data.

Keyed by what the graph is a function of (the FP32 graph's bytes, the recipe's parameters, the
calibration batches' key, ONNX Runtime's version for the calibration pass, the recipe code), so a warm
run finds it without parsing the FP32 graph, reading its ranges or calling a calibration callable.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import onnx

from quantverdict.cache import Cache
from quantverdict.capabilities import package_version
from quantverdict.export.compat import serialized
from quantverdict.hashing import content_hash, file_sha256, source_fingerprint
from quantverdict.models.spec import Batch
from quantverdict.precision.base import Recipe
from quantverdict.precision.bodies import branch_ranges
from quantverdict.precision.calibrate import calibrate, channel_ranges, held_values
from quantverdict.precision.matrix_device import matrix_key
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.rescaling import Prepared
from quantverdict.precision.single_layer import LayerGraphs, derivable


@dataclass(frozen=True)
class PrecisionGraph:
    source: Callable[[], Path]  # the FP32 graph, at the recipe's opset
    recipe: Recipe
    calibration: Callable[[], list[Batch]]  # called only when the graph is made
    calibration_key: Callable[[], str]
    cache: Cache
    name: str  # the model, for the cache entry's description

    def __call__(self) -> Path:
        return self.cache.get_or_create("precision", self.key(), ".onnx", self.make,
                                        {"model": self.name, **self.recipe.params()})

    def key(self) -> str:
        """What the graph is a function of, without making it."""
        recipe = self.recipe
        calibrated = recipe.calibrated or recipe.calibration_data
        calibration = [self.calibration_key(), package_version("onnxruntime")] if calibrated else None
        params = recipe.params()
        rounding = matrix_key() if params.get("gptq") else None  # GPTQ's H moves with the device
        return content_hash("precision", file_sha256(self.source()), params, calibration,
                            source_fingerprint("quantverdict.precision"), rounding)

    def make(self) -> bytes:
        """The graph's bytes, made now (not cached: :meth:`__call__` caches them)."""
        recipe = self.recipe
        if recipe.calibration_data:  # a recipe that calibrates itself from batches
            return serialized(recipe.apply_batches(onnx.load(str(self.source())), self.calibration()))
        prepared, ranges = self.prepared_and_ranges()
        made = recipe.apply(prepared.graph, ranges)
        if recipe.calibrated:  # corrections measured on the calibration set (bias correction)
            made = recipe.correct(made, prepared.graph, self.calibration(), prepared.rescaling)
        return serialized(made)

    def ranges(self) -> dict[str, float]:
        """The calibrated activation ranges (empty for an uncalibrated recipe); cached."""
        return self.prepared_and_ranges()[1]

    def layer_graphs(self, kept_in: str | None = None) -> LayerGraphs:
        """What each layer quantized alone (or kept alone in the wider format ``kept_in``: a recipe keeping its fallback
        in it, so that its graph is at the opset that format needs) is made from
        (:mod:`quantverdict.precision.single_layer`), for a recipe :func:`derivable` says it serves."""
        assert isinstance(self.recipe, QDQ) and derivable(self.recipe)
        assert kept_in is None or self.recipe.options.fallback_format == (kept_in,)
        prepared, ranges = self.prepared_and_ranges()
        return LayerGraphs.made(self.recipe, prepared, ranges, self.calibration(), kept_in)

    def prepared_and_ranges(self) -> tuple[Prepared, dict[str, float]]:
        """The FP32 graph as the recipe prepares it (SmoothQuant, equalization: the same function) and the
        recipe's calibrated ranges of that graph; the FP32 graph and no ranges for uncalibrated recipes."""
        recipe, graph = self.recipe, onnx.load(str(self.source()))
        if not recipe.calibrated:
            return Prepared(graph), {}
        prepared = recipe.prepare(graph, lambda graph_bytes, tensors, axis: channel_ranges(
            self.cache, graph_bytes, tensors, axis, self.calibration()))
        calibrating = recipe.calibration_recipe()
        tensors = calibrating.tensors_to_calibrate(prepared.graph)
        ranges = dict(calibrate(self.cache, prepared.graph.SerializeToString(), tensors, self.calibration(),
                                recipe.calibrator, shared=prepared.rescaling is None))
        if isinstance(recipe, QDQ):  # the layers inside an If's branches, each branch on its own batches
            ranges.update(branch_ranges(prepared.graph, calibrating.tensors_to_calibrate, self.calibration(),
                                        lambda graph, names, batches: calibrate(self.cache, graph, names, batches,
                                                                                recipe.calibrator),
                                        held_values))
        return prepared, ranges
