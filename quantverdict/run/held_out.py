"""Choosing a recipe (``recipe: auto``) on the run's artifacts with the calibration set split in two, once per
quarter: recipes calibrate on three quarters and are judged on the one left out, which stands in for the
evaluation set (the search never sees that one, so the case's verdict stays a verdict on unseen data)."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from quantverdict.errors import CalibrationError
from quantverdict.hashing import file_sha256
from quantverdict.judge.recipe_search import SearchResult, auto_settings, search
from quantverdict.models.spec import Batch
from quantverdict.precision import get_recipe
from quantverdict.precision.qdq import QDQ
from quantverdict.run.artifacts import ArtifactStore


def folds(batches: list[Batch]) -> int:
    """How many ways :func:`split` can hold a quarter of ``batches`` out (each batch held out once)."""
    return len(batches) // max(1, len(batches) // 4)


def split(batches: list[Batch], model: str, fold: int = 0) -> tuple[list[Batch], list[Batch]]:
    """A quarter of the batches (at least one) held out to judge on, the last quarter for fold 0, the one
    before it for fold 1, …; the rest to calibrate on: whole batches, since a graph exported with a fixed
    batch size takes no other."""
    if len(batches) < 2:
        raise CalibrationError(f"recipe auto for {model!r} needs at least 2 calibration batches (one to calibrate "
                               f"on, one held out to judge candidates on); the calibration set has {len(batches)}")
    held = max(1, len(batches) // 4)
    end = len(batches) - held * fold
    return batches[:end - held] + batches[end:], batches[end - held:end]


class HeldOutStore(ArtifactStore):
    """``clean``'s artifacts, with ``calibration`` the first part of the calibration set and ``evaluation`` the
    held-out rest (unlabelled, every sample counted: no resolution analysis on calibration data)."""

    def __init__(self, clean: ArtifactStore, fold: int = 0):
        super().__init__(clean.cache, clean.models, clean.backend, clean.tolerances, clean.calibrator, clean.caps,
                         clean.recipe_settings)
        self._modules, self._fp32, self.clean = clean._modules, clean._fp32, clean
        self._splits: dict[str, tuple[list[Batch], list[Batch]]] = {}
        self.fold = fold

    def _split(self, model: str) -> tuple[list[Batch], list[Batch]]:
        if model not in self._splits:  # a user's calibration callable is called once per search
            self._splits[model] = split(self.clean.calibration_batches(model), model, self.fold)
        return self._splits[model]

    def calibration_batches(self, model: str) -> list[Batch]:
        return self._split(model)[0]

    def _evaluation(self, model: str) -> tuple[list[Batch], np.ndarray | None]:
        return self._split(model)[1], None

    def undecided(self, model: str) -> np.ndarray | None:
        return None


def search_recipe(store: ArtifactStore, model: str, precision: str) -> SearchResult | None:
    """The search for ``precision``'s settings (:func:`quantverdict.judge.recipe_search.search`) where the model asks
    for one (``recipe: auto``, a manifest model's default for INT8 and FP8) and neither a graph of the user's nor
    this run's own settings (``--recipe-option``, ``--calibration``) decide them; None otherwise. Cached by the
    FP32 graph, the calibration data, the tolerance, the search's settings and the code."""
    spec = store.spec(model)
    auto = auto_settings(spec.recipe.get(precision, {}))
    if auto is None or precision in spec.quantized or store.recipe_settings.get(precision) or store.calibrator:
        return None
    base = get_recipe(precision).for_target("emulated")
    assert isinstance(base, QDQ)
    tolerance = store.tolerances.resolve(model, precision, spec.tolerances, spec.task)
    parts = [file_sha256(store.fp32_onnx(model)), precision, asdict(auto), tolerance.to_dict(),
             store.data_key(model, "calibration"), store.variant(),
             *store.onnxruntime_cpu_parts("quantverdict.judge", "quantverdict.precision", "quantverdict.run.held_out")]

    def searched() -> dict[str, Any]:
        if len(store.calibration_batches(model)) < 2:
            return SearchResult({}, note="one calibration batch: nothing to hold out and judge candidates on, so "
                                         "the default recipe").to_dict()
        views = [HeldOutStore(store, fold) for fold in range(folds(store.calibration_batches(model)))]
        return search(views, model, base, tolerance, auto).to_dict()

    return SearchResult.from_dict(store.cache.json("recipe-search", parts, searched,
                                                   {"model": model, "precision": precision}))
