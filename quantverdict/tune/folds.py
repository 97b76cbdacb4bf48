"""Choosing a recipe (``recipe: auto``) on the run's artifacts with the calibration set split in two, once per
quarter: recipes calibrate on three quarters and are judged on the one left out, which stands in for the
evaluation set (the search never sees that one, so the case's verdict stays a verdict on unseen data)."""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from quantverdict import freed_memory
from quantverdict.backends.samples import CODE as JOINING
from quantverdict.errors import CalibrationError
from quantverdict.judge.by_kind import ByKind
from quantverdict.models.spec import Batch, ModelSpec, sample_count
from quantverdict.precision import first_pass, get_recipe
from quantverdict.precision.batch_sets import planned
from quantverdict.precision.matrix_device import matrix_key
from quantverdict.precision.pools import small_pools
from quantverdict.precision.riders import riding
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.settings import RecipeSettings
from quantverdict.tune.auto import AutoSettings
from quantverdict.tune.check import check_lock
from quantverdict.tune.result import Incumbent, SearchResult, costed
from quantverdict.tune.search import LOG, Progress, search
from quantverdict.tune.stages import MIGRATION, ROUNDING

if TYPE_CHECKING:
    from quantverdict.tune.resolve import TuningBench


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


class HeldOut:
    """A :class:`~quantverdict.models.data.BatchSource` for fold ``fold`` of a search: ``calibration`` the rest of
    ``whole``'s calibration batches, ``evaluation`` the part held out (unlabelled, every sample counted). ``batches``
    keeps each model's whole set, shared by a search's folds (a user's calibration callable is called once per
    search)."""

    held_out = True

    def __init__(self, whole: Callable[[str], list[Batch]], fold: int = 0,
                 batches: dict[str, list[Batch]] | None = None):
        self.whole, self.fold, self.batches = whole, fold, {} if batches is None else batches

    def _split(self, spec: ModelSpec) -> tuple[list[Batch], list[Batch]]:
        if spec.name not in self.batches:
            self.batches[spec.name] = self.whole(spec.name)
        return split(self.batches[spec.name], spec.name, self.fold)

    def calibration(self, spec: ModelSpec) -> list[Batch]:
        return self._split(spec)[0]

    def evaluation(self, spec: ModelSpec, samples_needed: int) -> tuple[list[Batch], np.ndarray | None]:
        return self._split(spec)[1], None


def search_recipe(store: TuningBench, model: str, precision: str, auto: AutoSettings,
                  incumbent: Incumbent | None = None, progress: Progress | None = None) -> SearchResult:
    """The search for ``precision``'s settings (:func:`quantverdict.tune.search.search`); with ``incumbent`` (a lock's
    recipe), a check from the lock first (:func:`quantverdict.tune.check.check_lock`), and where it does not hold,
    the search with the lock's recipe judged beside its candidates; cached by the FP32 graph, the calibration data,
    the tolerance, the search's settings, the incumbent and the code. ``progress`` hears of a search that runs, not of
    one read from the cache."""
    spec = store.spec(model)
    base = get_recipe(precision).for_target("emulated")
    assert isinstance(base, QDQ)
    base = base.with_settings(auto.fixed())
    tolerance = store.tolerances.resolve(model, precision, spec.tolerances, spec.task)
    parts = [store.fp32_sha256(model), precision, asdict(auto), tolerance.to_dict(),
             store.data_key(model, "calibration"), store.variant(), incumbent and incumbent.key(), matrix_key(),
             *store.onnxruntime_cpu_parts("quantverdict.judge", "quantverdict.precision", "quantverdict.tune", JOINING)]

    def searched() -> dict[str, Any]:
        whole = {model: store.calibration_batches(model)}
        if len(whole[model]) < 2:
            return SearchResult(chosen=RecipeSettings(), note="one calibration batch: nothing to hold out and "
                                                              "judge candidates on, so the default recipe").to_dict()
        numbers = range(folds(whole[model]))
        views = [store.on_batches(HeldOut(store.calibration_batches, fold, whole)) for fold in numbers]
        held_out = [held_out_samples(whole[model], fold) for fold in numbers]
        report = progress or (lambda line: LOG.info("%s", line))
        sets = [whole[model], *(split(whole[model], model, fold)[0] for fold in numbers)]
        asked = [incumbent.settings, *incumbent.nearest] if incumbent else [*MIGRATION, *ROUNDING]
        with costed() as cost, freed_memory.kept(), planned(sets), riding(first_pass.planned(asked)), small_pools():
            judging = ByKind.of(spec, store.output_kinds(model), store.tolerances, precision, tolerance)
            checked = check_lock(store, views, held_out, model, base, judging, incumbent, report) \
                if incumbent else None
            result = checked or search(store, views, held_out, model, base, judging, auto,
                                       incumbent.settings if incumbent else None, report)
        result.chosen = auto.fixed().over(result.chosen)  # what the user fixed beside the search: locked with it
        result.cost = cost()
        report(f"recipe search {model} {base.name}: {result.cost.words()}")
        return result.to_dict()

    return SearchResult.model_validate(store.cache.json("recipe-search", parts, searched,
                                                        {"model": model, "precision": precision}))
