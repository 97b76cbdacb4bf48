"""A recipe chosen for each model (``recipe: auto``), on held-out calibration data, within a time budget.

A fixed recipe is tuned for the networks it was chosen on; a network nobody tuned for gets whatever that
recipe happens to do to it. The search here tries the techniques the harness has, in stages as Intel
Neural Compressor's basic strategy and NNCF's accuracy control do: first the calibrator (max,
percentile, MSE), then each technique on top of the best so far, kept only where it helps (SmoothQuant
at two migration strengths, equalization, bias correction, GPTQ), then, only where the best still
misses the precision's tolerance, FP32 fallback of the most sensitive layers one at a time up to a
declared share (as NNCF's accuracy control and Model Optimizer's ``auto_quantize`` spend a budget).

Every candidate is calibrated on the first part of the calibration set and judged on the rest (its
graph's exact semantics against FP32): the evaluation set, on which the case is judged afterwards,
is never seen. ``workbench`` is that split view (:class:`quantverdict.run.held_out.HeldOutStore`).
The chosen settings are then applied with the whole calibration set like any hand-set recipe.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from quantverdict.errors import CalibrationError, HarnessError
from quantverdict.judge.bench import Workbench
from quantverdict.judge.compare import Comparison
from quantverdict.judge.sensitivity import evaluate_recipe, fallback_until_within, weighted_layers
from quantverdict.judge.tolerances import Tolerance
from quantverdict.precision.base import Recipe
from quantverdict.precision.qdq import QDQ

AUTO_KEYS = ("auto", "budget_s", "max_fallback")
DEFAULT_BUDGET_S = 300.0
DEFAULT_MAX_FALLBACK = 0.1
MIN_GAIN_DB = 0.1  # the SNR gain on held-out data that makes a more elaborate candidate worth taking
CALIBRATORS: list[dict[str, Any]] = [{"calibration": "max"}, {"calibration": "percentile"}, {"calibration": "mse"}]
TECHNIQUES: list[list[dict[str, Any]]] = [  # each stage's alternatives, each tried on top of the best so far
    [{"smoothquant": 0.5}, {"smoothquant": 0.8}], [{"equalize": True}], [{"bias_correction": True}], [{"gptq": True}]]


@dataclass(frozen=True)
class AutoSettings:
    """``recipe: {int8: {auto: true, budget_s: 300, max_fallback: 0.1}}``: the search's own settings."""

    budget_s: float = DEFAULT_BUDGET_S
    max_fallback: float = DEFAULT_MAX_FALLBACK


def auto_settings(settings: Mapping[str, Any]) -> AutoSettings | None:
    """The search's settings where ``settings`` asks for one (``auto: true``), else None; a recipe setting
    beside ``auto`` is refused: the search chooses them all (remove ``auto`` to set them by hand)."""
    if not settings.get("auto"):
        return None
    fixed = sorted(set(settings) - set(AUTO_KEYS))
    if fixed:
        raise CalibrationError(f"recipe auto chooses every setting, so {', '.join(fixed)} cannot be set beside it "
                               "(remove auto to set them by hand)")
    budget, share = float(settings.get("budget_s", DEFAULT_BUDGET_S)), float(settings.get("max_fallback",
                                                                                         DEFAULT_MAX_FALLBACK))
    if budget < 0 or not 0 <= share < 1:
        raise CalibrationError(f"recipe auto: budget_s {budget} must be ≥ 0 and max_fallback {share} in [0, 1)")
    return AutoSettings(budget, share)


@dataclass
class Candidate:
    settings: dict[str, Any]
    score: list[float] | None = None  # what candidates are ranked by, higher first (see :func:`score`)
    passed: bool | None = None  # within the precision's tolerance on the held-out data
    seconds: float = 0.0
    error: str | None = None  # a technique this graph refuses (its message), not a failed search


@dataclass
class SearchResult:
    chosen: dict[str, Any]
    candidates: list[Candidate] = field(default_factory=list)
    held_out_samples: int = 0
    not_tried: list[dict[str, Any]] = field(default_factory=list)  # left when the time budget ran out
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SearchResult":
        return cls(data["chosen"], [Candidate(**c) for c in data["candidates"]], data["held_out_samples"],
                   data["not_tried"], data["note"])


def score(comparison: Comparison, output: str) -> list[float]:
    """The output's SNR against FP32 on the held-out data: continuous, where top-1 agreement on the few samples a
    calibration set holds out moves in steps of a sample (1/16 of sixteen crops) and ranks by chance."""
    return [min(float(comparison.metrics[output]["snr_db"]), 1e3)]


def better(score: list[float], than: list[float] | None) -> bool:
    """More than :data:`MIN_GAIN_DB` higher: a candidate that only matches the simpler one before it (within what
    another calibration draw would move) is not taken."""
    return than is None or score[0] > than[0] + MIN_GAIN_DB


def search(workbench: Workbench, model: str, base: QDQ, tolerance: Tolerance, auto: AutoSettings) -> SearchResult:
    """The best settings for ``base`` (a Q/DQ recipe) on ``model``, judged on the held-out calibration data."""
    spec = workbench.spec(model)
    output = spec.outputs[0]
    result = SearchResult(chosen={}, held_out_samples=len(next(iter(workbench.fp32_outputs(model, "evaluation")
                                                                     .values()))))
    deadline = time.monotonic() + auto.budget_s
    best: Candidate | None = None

    def attempt(settings: dict[str, Any]) -> Candidate:
        start = time.perf_counter()
        candidate = Candidate(settings)
        try:
            comparison = evaluate_recipe(workbench, model, base.configured(settings), tolerance)
            candidate.score, candidate.passed = score(comparison, output), comparison.passed
        except HarnessError as exc:  # a technique that does not apply to this graph
            candidate.error = str(exc).splitlines()[0]
        candidate.seconds = round(time.perf_counter() - start, 3)
        result.candidates.append(candidate)
        return candidate

    for stage in [CALIBRATORS, *TECHNIQUES]:
        stage_best = best
        for option in stage:  # each alternative on top of the previous stages' best
            settings = {**(best.settings if best else {}), **option}
            if (stage_best or best) is not None and time.monotonic() > deadline:
                result.not_tried.append(settings)
                continue
            tried = attempt(settings)
            if tried.score is not None and better(tried.score, stage_best.score if stage_best else None):
                stage_best = tried
        best = stage_best
    if result.not_tried:
        result.note = f"time budget of {auto.budget_s:g} s spent: {len(result.not_tried)} candidates not tried"
    if best is None:
        raise CalibrationError(f"recipe auto for {model!r}: every candidate failed; the first: "
                               f"{result.candidates[0].error}")
    result.chosen = dict(best.settings)
    if not best.passed and auto.max_fallback > 0 and time.monotonic() <= deadline:
        result.chosen = _fallback(workbench, model, base.configured(best.settings), tolerance, auto, best, attempt)
    return result


def _fallback(workbench: Workbench, model: str, recipe: Recipe, tolerance: Tolerance, auto: AutoSettings,
              best: Candidate, attempt: Callable[[dict[str, Any]], Candidate]) -> dict[str, Any]:
    """The fewest most-sensitive layers (at most ``max_fallback`` of them) kept in FP32 that bring the held-out
    data within the tolerance, as ``exclude`` names; the best without fallback where none is needed or allowed."""
    assert isinstance(recipe, QDQ)
    allowed = math.floor(auto.max_fallback * len(weighted_layers(workbench, model, recipe)))
    if allowed == 0:
        return dict(best.settings)
    _, kept, _ = fallback_until_within(workbench, model, recipe, tolerance, allowed)
    if not kept:
        return dict(best.settings)
    settings = {**best.settings, "exclude": [literal(name) for name in kept]}
    tried = attempt(settings)
    return settings if tried.passed else dict(best.settings)


def literal(name: str) -> str:
    """A node name as an ``exclude`` pattern matching it alone (fnmatch's special characters bracketed)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name) if any(c in name for c in "*?[") else name

