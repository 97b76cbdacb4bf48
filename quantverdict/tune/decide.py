"""Deciding a case before anything is calibrated or searched: where the coverage of its recipe's placement on the FP32
graph already says the case is skipped or failed (:func:`quantverdict.judge.coverage.coverage_verdict`), the case ends
there, and a lock does not search for it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from quantverdict.judge.coverage import coverage_verdict
from quantverdict.precision import Recipe, get_recipe
from quantverdict.tune.resolve import Resolver


@dataclass(frozen=True)
class Decided:
    """A case its recipe's placement decides before anything is calibrated: skipped or failed, why, and the coverage
    that says so."""

    status: Literal["failed", "skipped"]
    message: str
    coverage: dict[str, Any]


def planned(recipes: Resolver, model: str, precision: str, target: str) -> Recipe:
    """``precision``'s recipe as far as it is known before anything is calibrated or searched: the lock's where it
    applies, else the settings given (a search's to choose: the defaults, with those fixed beside it), its
    fallback layers not chosen."""
    recipe = get_recipe(precision).for_target(target)
    if not recipe.configurable:
        return recipe
    if recipes.locked(model, precision) is not None:
        return recipes.recipe(model, precision, target)  # the lock names its layers: nothing to calibrate for them
    auto = recipes.auto(model, precision)  # a search's to choose: the defaults, and what is fixed beside it
    return recipe.configured(auto.fixed() if auto is not None else recipes.settings(model, precision))


def decided_before_calibration(recipes: Resolver, model: str, precision: str, target: str) -> Decided | None:
    """A case of ``precision`` that the coverage of its recipe's placement decides before any calibration or
    search (:func:`quantverdict.judge.coverage.coverage_verdict`: most of the weights in float for want of a
    kernel, or a layer the recipe does not see), with the verdict's status, message and that coverage; None
    where only the graph made and judged decides. Where the fallback has layers to choose, they count as
    quantized: no choice of them would change the verdict."""
    recipe = planned(recipes, model, precision, target)
    coverage = recipes.bench.planned_coverage(model, recipe) if recipe.quantized else None
    verdict = coverage_verdict(coverage, precision, model, "the recipe") if coverage is not None else None
    if verdict is None:
        return None
    assert coverage is not None
    return Decided(*verdict, coverage)
