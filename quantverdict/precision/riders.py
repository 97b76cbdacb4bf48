"""Statistics that ride the pass which calibrates a graph: measured from the same values, batch by batch, so that a
statistic a recipe search will ask of its unprepared FP32 graph (SmoothQuant's and equalization's channel ranges,
GPTQ's H: :mod:`quantverdict.precision.first_pass`) costs no pass of its own.

While :func:`riding` holds a plan, the calibration pass of a graph shared by every set of a search
(:func:`quantverdict.precision.calibrate.calibrate`, ``shared``) asks it for riders of that graph, exposes their
tensors beside its own, hands each batch's values to them and, once every batch has passed, has them keep what they
measured for each set where the statistic's own function looks first (its in-process table). Each set's value is
accumulated from its own batches in its own order, as a pass of its own would: the same value, bit for bit.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from quantverdict.models.spec import Batch


class Rider(Protocol):
    """A statistic of one graph over several sets of batches, accumulated from the values of ``tensors``."""

    tensors: Sequence[str]

    def add(self, holding: Sequence[int], values: Mapping[str, np.ndarray]) -> None:
        """A batch's values (of a part of the tensors) added to the sets (by index) that hold the batch."""

    def keep(self, sets: Sequence[Sequence[Batch]]) -> None:
        """Each set's statistic, kept where its function reads it."""


Plan = Callable[[bytes, int], list[Rider]]  # a graph's bytes and how many sets pass → the riders of that graph
_PLANS: list[Plan] = []
_SPENT = [0.0]  # seconds riders took in this process


@contextmanager
def riding(plan: Plan) -> Iterator[None]:
    """While inside, a shared calibration pass of a graph carries the riders ``plan`` gives for it."""
    _PLANS.append(plan)
    try:
        yield
    finally:
        _PLANS.remove(plan)


def riders(model_bytes: bytes, sets: int) -> list[Rider]:
    """The riders every plan held gives for the graph ``model_bytes``, measured over ``sets`` sets of batches."""
    return [rider for plan in _PLANS for rider in plan(model_bytes, sets)]


def ride(carried: Sequence[Rider], holding: Sequence[int], values: Mapping[str, np.ndarray]) -> None:
    """A batch's values handed to each rider ``carried``, the time they take counted (:func:`spent`)."""
    started = time.perf_counter()
    for rider in carried:
        rider.add(holding, values)
    _SPENT[0] += time.perf_counter() - started


def spent() -> float:
    """Seconds riders have taken in this process: work a search's first candidate does for later ones, which its
    estimate of the time left prices apart (:func:`quantverdict.tune.progress.time_left`)."""
    return _SPENT[0]
