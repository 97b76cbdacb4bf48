"""Choosing a recipe (``recipe: auto``) on the run's artifacts with the calibration set split in two, once per
quarter: recipes calibrate on three quarters and are judged on the one left out, which stands in for the
evaluation set (the search never sees that one, so the case's verdict stays a verdict on unseen data)."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from quantverdict import freed_memory
from quantverdict.errors import CalibrationError
from quantverdict.hashing import file_sha256
from quantverdict.judge.recipe_search import AutoSettings, Progress, SearchResult, search
from quantverdict.models.spec import Batch, sample_count
from quantverdict.precision import get_recipe
from quantverdict.precision.qdq import QDQ
from quantverdict.run.artifacts import ArtifactStore
from quantverdict.run.recipes import RecipeOptions


def folds(batches: list[Batch]) -> int:
    """How many parts :func:`split` holds out in turn: quarters, or single batches where there are fewer than four."""
    return min(4, len(batches))


def split(batches: list[Batch], model: str, fold: int = 0) -> tuple[list[Batch], list[Batch]]:
    """The ``fold``-th of :func:`folds` near-equal parts of the batches held out to judge on, counted from the end
    (fold 0 is the last part), the rest to calibrate on, so that the folds hold every batch out once: whole batches,
    since a graph exported with a fixed batch size takes no other."""
    if len(batches) < 2:
        raise CalibrationError(f"recipe auto for {model!r} needs at least 2 calibration batches (one to calibrate "
                               f"on, one held out to judge candidates on); the calibration set has {len(batches)}")
    start, end = _bounds(batches, fold)
    return batches[:start] + batches[end:], batches[start:end]


def held_out_samples(batches: list[Batch], fold: int) -> np.ndarray:
    """The indices, in the whole calibration set's samples, of those :func:`split` holds out in ``fold``."""
    sizes = np.cumsum([0] + [sample_count(batch) for batch in batches])
    start, end = _bounds(batches, fold)
    return np.arange(sizes[start], sizes[end])


def _bounds(batches: list[Batch], fold: int) -> tuple[int, int]:
    count, parts = len(batches), folds(batches)
    return count - count * (fold + 1) // parts, count - count * fold // parts


class HeldOutStore(ArtifactStore):
    """``clean``'s artifacts, with ``calibration`` the first part of the calibration set and ``evaluation`` the
    held-out rest (unlabelled, every sample counted: no resolution analysis on calibration data)."""

    def __init__(self, clean: ArtifactStore, fold: int = 0, whole: dict[str, list[Batch]] | None = None):
        super().__init__(clean.cache, clean.models, clean.backend, clean.tolerances, clean.caps,
                         RecipeOptions(clean.options.settings))  # a fold's recipes are the search's candidates
        self._modules, self._fp32, self.clean = clean._modules, clean._fp32, clean
        self._splits: dict[str, tuple[list[Batch], list[Batch]]] = {}
        self.fold = fold
        self._whole = {} if whole is None else whole  # shared by a search's folds: clean's batches, per model

    def _split(self, model: str) -> tuple[list[Batch], list[Batch]]:
        if model not in self._splits:
            if model not in self._whole:  # a user's calibration callable is called once per search
                self._whole[model] = self.clean.calibration_batches(model)
            self._splits[model] = split(self._whole[model], model, self.fold)
        return self._splits[model]

    def calibration_batches(self, model: str) -> list[Batch]:
        return self._split(model)[0]

    def _evaluation(self, model: str) -> tuple[list[Batch], np.ndarray | None]:
        return self._split(model)[1], None

    def undecided(self, model: str) -> np.ndarray | None:
        return None


def search_recipe(store: ArtifactStore, model: str, precision: str, auto: AutoSettings,
                  incumbent: dict[str, Any] | None = None, progress: Progress | None = None) -> SearchResult:
    """The search for ``precision``'s settings (:func:`quantverdict.judge.recipe_search.search`), with ``incumbent``
    judged beside its candidates; cached by the FP32 graph, the calibration data, the tolerance, the search's settings,
    the incumbent and the code. ``progress`` hears of a search that runs, not of one read from the cache."""
    spec = store.spec(model)
    base = get_recipe(precision).for_target("emulated")
    assert isinstance(base, QDQ)
    tolerance = store.tolerances.resolve(model, precision, spec.tolerances, spec.task)
    parts = [file_sha256(store.fp32_onnx(model)), precision, asdict(auto), tolerance.to_dict(),
             store.data_key(model, "calibration"), store.variant(), incumbent,
             *store.onnxruntime_cpu_parts("quantverdict.judge", "quantverdict.precision", "quantverdict.run.held_out")]

    def searched() -> dict[str, Any]:
        whole = {model: store.calibration_batches(model)}
        if len(whole[model]) < 2:
            return SearchResult({}, note="one calibration batch: nothing to hold out and judge candidates on, so "
                                         "the default recipe").to_dict()
        numbers = range(folds(whole[model]))
        views = [HeldOutStore(store, fold, whole) for fold in numbers]
        held_out = [held_out_samples(whole[model], fold) for fold in numbers]
        with freed_memory.kept():
            return search(store, views, held_out, model, base, tolerance, auto, incumbent, progress).to_dict()

    return SearchResult.from_dict(store.cache.json("recipe-search", parts, searched,
                                                   {"model": model, "precision": precision}))
