"""Judge candidate outputs against reference outputs with the bounds of a :class:`Tolerance`.

The elementwise atol/rtol check is Polygraphy's ``SimpleCompareFunc`` (same semantics as
``polygraphy run --atol --rtol``); the scale-free metrics are computed here in float64, never
in the precision under test. Metrics over samples carry 95% confidence intervals, and a bound
finer than the samples can resolve is widened with a warning (:mod:`quantverdict.judge.intervals`).
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from quantverdict.errors import InputSpecError, ResolutionWarning
from quantverdict.judge.input_dependence import constant_outputs
from quantverdict.judge.intervals import (accuracy_drop_interval, bootstrap_cosine_snr, proportion_interval,
                                     resolve_agreement_bound, resolve_drop_bound)
from quantverdict.judge.detections import detection_metrics
from quantverdict.judge.elementwise import within_bounds
from quantverdict.judge.map_decisions import map_decisions
from quantverdict.judge.sequences import sequence_metrics
from quantverdict.judge.tolerances import Tolerance
from quantverdict.models.spec import DetectionFormat, SequenceFormat

WORST_ELEMENTS = 5
HISTOGRAM_EDGES = [0.0, *np.logspace(-7, 0, 15).tolist(), float("inf")]  # |err| / max |reference|


@dataclass(frozen=True)
class Check:
    """One metric against one bound."""

    output: str
    metric: str
    observed: float
    bound: float
    higher_is_better: bool

    @property
    def passed(self) -> bool:
        if not np.isfinite(self.observed):
            return False
        return self.observed >= self.bound if self.higher_is_better else self.observed <= self.bound

    def describe(self) -> str:
        observed, bound = shown_beside(self.observed, self.bound), shown_bound(self.bound)
        return f"{self.output}: {self.metric} = {observed}, must be {relation(self.higher_is_better)} {bound}"

    def requirement(self) -> str:
        """The bound alone, as the user wrote it: ``logits: cosine ≥ 0.99``."""
        return f"{self.output}: {self.metric} {relation(self.higher_is_better)} {shown_bound(self.bound)}"


def relation(higher_is_better: bool) -> str:
    """How a metric must stand to its bound."""
    return "≥" if higher_is_better else "≤"


def shown_bound(bound: float) -> str:
    """A bound as the user wrote it: 0.9999995 is not shown as 1."""
    text = f"{bound:g}"
    return text if float(text) == bound else repr(bound)


def shown_beside(value: float, bound: float) -> str:
    """``value`` in six significant digits, or as many more as keep it on its side of ``bound`` (0.9699999 against
    0.97 is not shown as 0.97)."""
    if not np.isfinite(value):
        return f"{value}"
    for digits in range(6, 18):
        text = f"{value:.{digits}g}"
        if np.sign(float(text) - bound) == np.sign(value - bound):
            return text
    return repr(value)


@dataclass
class Comparison:
    """Every metric computed, every bound checked, and the worst elements of each output."""

    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    worst: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # bounds widened to what the samples resolve
    task: dict[str, Any] | None = None  # task accuracy, where the model has labelled samples
    task_metrics: dict[str, float] | None = None  # the model's own task metrics (quantverdict.judge.task_metrics)

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def __bool__(self) -> bool:
        return self.passed

    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    def explain(self) -> str:
        lines = []
        for check in self.failures():
            lines.append(check.describe())
            counts = self.metrics.get(check.output, {})
            if check.metric == "top1_agreement" and "top1_undecided" in counts:
                lines.append(f"{check.output}: top1_agreement is over the {counts['top1_samples']} samples FP32 "
                             f"decides at its inputs' resolution ({counts['top1_undecided']} undecided left out; "
                             f"over all: {counts['top1_agreement_all']:.6g})")
            if check.metric.startswith("region_iou"):
                lines.append(f"{check.output}: the region above {counts['region_threshold']:g}, on the elements FP32 "
                             f"decides, in {counts['region_samples']} samples; worst: sample "
                             f"{counts.get('region_iou_worst_sample', '-')}")
        for output in sorted({check.output for check in self.failures()} & set(self.worst)):
            worst = ", ".join(f"{w['index']}: ref {w['reference']:.5g} got {w['candidate']:.5g}"
                              for w in self.worst[output])
            lines.append(f"{output}: worst elements {worst}")
        return "\n".join(lines)

    def note(self, text: str | None) -> None:
        """Keep ``text`` (if any) in the result and warn with it (pytest lists warnings in its summary)."""
        if text and text not in self.notes:
            self.notes.append(text)
            warnings.warn(text, ResolutionWarning, stacklevel=3)

    def to_dict(self) -> dict[str, object]:
        out = {"metrics": self.metrics, "worst": self.worst, "notes": self.notes,
               "checks": [{**asdict(c), "passed": c.passed} for c in self.checks]}
        if self.task_metrics is not None:
            out["task_metrics"] = self.task_metrics
        return {**out, "task": self.task} if self.task is not None else out


def compare(
    reference: dict[str, np.ndarray],
    candidate: dict[str, np.ndarray],
    tolerance: Tolerance,
    classification: bool = False,
    undecided: np.ndarray | None = None,
    per_output: Mapping[str, Tolerance] | None = None,
    positionwise: frozenset[str] = frozenset(),
    maps: Mapping[str, float] | None = None,
    detections: Mapping[str, DetectionFormat] | None = None,
    sequences: Mapping[str, SequenceFormat] | None = None,
    labels: frozenset[str] = frozenset(),
) -> Comparison:
    """Compare named outputs (batches already concatenated) under ``tolerance``, or an output's own bounds in
    ``per_output`` (its kind's: :mod:`quantverdict.judge.output_kinds`); top-1 agreement leaves out the
    ``undecided`` samples, those whose FP32 decision the input does not determine (:mod:`quantverdict.judge.decided`),
    and is taken at every position of the ``positionwise`` outputs (a softmax per position). The ``maps`` (output →
    threshold) are probability maps, also judged by their region and peak (:mod:`quantverdict.judge.map_decisions`);
    the ``detections`` (output → layout) are detector heads, judged by their detections, and by the raw bounds on the
    anchors FP32 keeps only (:mod:`quantverdict.judge.detections`); the ``sequences`` by what they decode to
    (:mod:`quantverdict.judge.sequences`); the ``labels`` (integers or booleans) by the share of elements equal to
    FP32's. A classifier's first output is its scores; another of one value a sample is judged without top-1."""
    result = Comparison()
    for name, ref in reference.items():
        bounds = (per_output or {}).get(name, tolerance)
        if name not in candidate:
            result.checks.append(Check(name, "present", 0.0, 1.0, True))
            continue
        out = np.asarray(candidate[name])
        if out.shape != ref.shape:
            result.checks.append(Check(name, f"shape {out.shape} vs {ref.shape}", 0.0, 1.0, True))
            continue
        scores = classification and name not in labels and ref.ndim >= 2  # [batch, classes]: top-1 judged
        if classification and name not in labels and not scores and name == next(iter(reference)):
            raise InputSpecError(f"output {name!r} has shape {ref.shape}: a classifier's outputs are [batch, classes] "
                                 "(top-1 agreement is judged per sample, so an output without its batch axis cannot be "
                                 "judged); declare task: regression if it is not a classifier")
        if name in (detections or {}):
            found, (ref, out) = detection_metrics(ref, out, (detections or {})[name], bounds.min_cosine)
            metrics = {**(_metrics(ref, out, False, None) if len(ref) else {"samples": 0}), **found}
        else:
            metrics = _metrics(ref, out, scores or name in positionwise, None if name in positionwise else undecided)
        if name in labels:  # the elements compared once: a segmentation mask's are millions
            agreed, size = int(np.count_nonzero(ref == out)), int(ref.size)
            metrics.update(label_agreement=agreed / size if size else 1.0, label_samples=size)
            metrics["intervals"]["label_agreement"] = proportion_interval(agreed, size).to_dict()
        if name in (sequences or {}) and ref.ndim == 3:
            metrics.update(sequence_metrics(ref, out, (sequences or {})[name]))
        if name in (maps or {}) and ref.ndim >= 2:
            metrics.update(map_decisions(ref, out, (maps or {})[name], bounds.min_cosine))
        result.metrics[name] = metrics
        result.worst[name] = _worst(ref, out) if ref.size else []
        result.checks += _checks(name, metrics, bounds, result)
        if bounds.atol is not None or bounds.rtol is not None:
            atol, rtol = bounds.atol or 0.0, bounds.rtol or 0.0
            result.checks.append(Check(name, f"fraction within atol={atol:g}/rtol={rtol:g}",
                                       within_bounds(name, ref, out, atol, rtol), 1.0, True))
    result.note(constant_outputs(reference))
    return result


def task_accuracy(reference_correct: np.ndarray, candidate_correct: np.ndarray, tolerance: Tolerance,
                  result: Comparison) -> dict[str, Any]:
    """Task accuracy of reference and candidate on the same labelled samples, with intervals; the
    drop (percentage points) is checked against ``max_accuracy_drop``, widened to one sample's
    worth if it is finer than that."""
    ref, cand = np.asarray(reference_correct, bool), np.asarray(candidate_correct, bool)
    n = ref.size
    ref_acc, cand_acc = float(ref.mean()), float(cand.mean())
    task = {"samples": n, "reference_accuracy": ref_acc, "accuracy": cand_acc,
            "accuracy_drop_points": 100.0 * (ref_acc - cand_acc),
            "intervals": {"accuracy": proportion_interval(int(cand.sum()), n).to_dict(),
                          "accuracy_drop_points": accuracy_drop_interval(ref, cand).to_dict()}}
    if tolerance.max_accuracy_drop is not None:
        bound = resolve_drop_bound(tolerance.max_accuracy_drop, n, "max_accuracy_drop")
        result.note(bound.warning)
        result.checks.append(Check("task", "accuracy drop (points)", task["accuracy_drop_points"], bound.used, False))
    return task


def judge_task_metrics(values: Mapping[str, float], tolerance: Tolerance, result: Comparison, where: str = "the task metric"
                       ) -> None:
    """Keep a model's task metrics in ``result`` and check each bound the tolerance gives them; a
    bound on a metric the model's metric function does not return fails, naming what it returns; anything but
    names → numbers is an error naming ``where`` (the metric callable)."""
    if not isinstance(values, Mapping) or not all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
                                                  for v in values.values()):
        raise InputSpecError(f"{where} returned {type(values).__name__} {str(values)[:80]}; expected a mapping of "
                             "metric names to numbers ({'text_agreement': 0.98})")
    result.task_metrics = {name: float(value) for name, value in values.items()}
    for bounds, higher in ((tolerance.task_min or {}, True), (tolerance.task_max or {}, False)):
        for name, bound in bounds.items():
            observed = result.task_metrics.get(name, float("nan"))
            label = name if name in result.task_metrics else f"{name} (not returned; got {sorted(values)})"
            result.checks.append(Check("task", label, observed, float(bound), higher))


def cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Cosine similarity in float64 (1 for two all-zero tensors, 0 for one), clipped to [-1, 1]; NaN, unwarned, where
    a value is not finite (``nonfinite`` names it)."""
    r, c = np.asarray(reference, np.float64).ravel(), np.asarray(candidate, np.float64).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        denom = np.linalg.norm(r) * np.linalg.norm(c)
        return float(np.array_equal(r, c)) if denom == 0 else float(np.clip(np.dot(r, c) / denom, -1.0, 1.0))


def _metrics(ref: np.ndarray, out: np.ndarray, classification: bool, undecided: np.ndarray | None) -> dict[str, Any]:
    r, c = ref.astype(np.float64).ravel(), out.astype(np.float64).ravel()
    diff = np.abs(c - r)
    peak = np.max(np.abs(r)) if r.size else 0.0
    noise = np.sum((c - r) ** 2)
    metrics = {
        "max_abs_err": float(np.max(diff)) if diff.size else 0.0,
        "mean_abs_err": float(np.mean(diff)) if diff.size else 0.0,
        "max_norm_err": float(np.max(diff) / peak) if peak > 0 else float(np.max(diff, initial=0.0)),
        "cosine": cosine(r, c),
        "snr_db": np.inf if noise == 0 else -np.inf if noise == np.inf else float(10 * np.log10(np.sum(r * r) / noise)),
        "nonfinite": float(np.count_nonzero(~np.isfinite(c) & np.isfinite(r))),
        "error_histogram": np.histogram(np.nan_to_num(diff / peak if peak > 0 else diff, nan=np.inf),
                                        bins=HISTOGRAM_EDGES)[0].tolist(),
    }
    samples = ref.shape[0] if ref.ndim else 1
    metrics["samples"] = samples
    intervals = {k: v.to_dict() for k, v in (bootstrap_cosine_snr(ref, out) or {}).items()}
    if classification and ref.ndim >= 2:
        agree = ref.argmax(-1) == out.argmax(-1)
        counted = agree
        if undecided is not None and undecided.shape == agree.shape:
            counted = agree[~undecided]
            metrics["top1_undecided"] = int(undecided.sum())
            metrics["top1_agreement_all"] = float(np.mean(agree))
        metrics["top1_samples"] = int(counted.size)
        metrics["top1_agreement"] = float(np.mean(counted)) if counted.size else float("nan")
        intervals["top1_agreement"] = proportion_interval(int(counted.sum()), int(counted.size)).to_dict()
    metrics["intervals"] = intervals
    return metrics


# an agreement metric → (its bound's name, the metric counting the samples it is a share of)
AGREEMENTS = {"top1_agreement": ("min_top1", "top1_samples"), "peak_agreement": ("min_peak_agreement", "samples"),
              "sequence_agreement": ("min_sequence_agreement", "sequence_samples"),
              "label_agreement": ("min_top1", "label_samples")}


def _checks(name: str, metrics: dict[str, Any], tol: Tolerance, result: Comparison) -> list[Check]:
    resolved: dict[str, float | None] = {}
    for metric, (bound_name, counted) in AGREEMENTS.items():  # a share bound finer than its samples resolve widens
        bound = getattr(tol, bound_name)
        if bound is not None and metric in metrics:
            resolution = resolve_agreement_bound(bound, max(metrics[counted], 1), f"{name}: {bound_name}")
            result.note(resolution.warning)
            bound = resolution.used
        resolved[metric] = bound
    bounds = [("nonfinite", 0.0, False), ("cosine", tol.min_cosine, True),
              ("max_norm_err", tol.max_norm_err, False), ("top1_agreement", resolved["top1_agreement"], True),
              ("region_iou", tol.min_region_iou, True), ("region_iou_worst", tol.min_worst_region_iou, True),
              ("peak_agreement", resolved["peak_agreement"], True), ("detection_f1", tol.min_detection_f1, True),
              ("sequence_agreement", resolved["sequence_agreement"], True),
              ("label_agreement", resolved["label_agreement"], True)]
    return [Check(name, metric, metrics[metric], bound, higher)
            for metric, bound, higher in bounds if bound is not None and metric in metrics]


def _worst(ref: np.ndarray, out: np.ndarray) -> list[dict[str, object]]:
    diff = np.abs(out.astype(np.float64) - ref.astype(np.float64)).ravel()
    order = np.argsort(np.nan_to_num(diff, nan=np.inf))[::-1][:WORST_ELEMENTS]
    return [{"index": list(map(int, np.unravel_index(i, ref.shape))), "reference": float(ref.ravel()[i]),
             "candidate": float(out.ravel()[i])} for i in order]
