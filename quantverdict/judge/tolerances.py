"""Tolerances as data: a per-precision default table with per-model overrides.

The table ships with the package (``quantverdict/defaults/tolerances.yaml``); a user's file
(``--tolerances``, or ``tolerances`` in the project's settings) is merged over it bound by bound,
so it need only name what it changes (``null`` removes a bound).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, field_validator

from quantverdict.documents import layers
from quantverdict.judge.intervals import samples_to_resolve
from quantverdict.precision import known_precisions

PrecisionName = Literal[tuple(known_precisions())]  # type: ignore[valid-type]


class Tolerance(BaseModel):
    """Bounds for one case; ``None`` means the metric is reported but not checked. Also the schema of
    one precision's bounds in a tolerance file or a manifest entry (every field optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    max_norm_err: float | None = None
    min_top1: float | None = None
    max_accuracy_drop: float | None = None
    max_flip_fraction: float | None = None  # runtime fidelity (quantverdict.judge.fidelity); quantized precisions
    min_region_iou: float | None = None  # a probability map's region at its threshold (judge.map_decisions), mean
    min_worst_region_iou: float | None = None  # ... and its worst sample's
    min_peak_agreement: float | None = None  # a probability map's peak where FP32's is
    min_detection_f1: float | None = None  # a detector head's detections against FP32's, per image (judge.detections)
    min_sequence_agreement: float | None = None  # the share of samples a sequence output decodes as FP32's does
    task_min: Mapping[str, float] | None = None  # bounds on the model's task metrics, by name (judge.task_metrics)
    task_max: Mapping[str, float] | None = None

    @field_validator("atol", "rtol", "min_cosine", "max_norm_err", "min_top1", "max_accuracy_drop",
                     "max_flip_fraction", "min_region_iou", "min_worst_region_iou", "min_peak_agreement",
                     "min_detection_f1", "min_sequence_agreement")
    @classmethod
    def _bound(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"a bound is a finite number ≥ 0, not {value!r}")
        return value

    @field_validator("task_min", "task_max")
    @classmethod
    def _task_bounds(cls, value: Mapping[str, float] | None) -> Mapping[str, float] | None:
        for name, bound in (value or {}).items():
            if not math.isfinite(bound):
                raise ValueError(f"{name}: a bound is a finite number, not {bound!r}")
        return value

    def to_dict(self) -> dict[str, Any]:
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in self.model_dump().items() if v is not None}

    def given(self) -> dict[str, Any]:
        """The bounds written in the file (``null`` included), for merging over other bounds."""
        return self.model_dump(exclude_unset=True)


# what an output is, which its bounds fit (quantverdict.judge.output_kinds reads it off the graph)
OutputKind = Literal["logits", "distribution", "probabilities", "detections", "labels"]
PerPrecision = dict[PrecisionName, Tolerance]  # type: ignore[valid-type]


class ToleranceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: PerPrecision = {}
    tasks: dict[Literal["classification", "regression", "embedding"], PerPrecision] = {}
    outputs: dict[OutputKind, PerPrecision] = {}
    models: dict[str, PerPrecision] = {}


class ToleranceTable:
    """Resolved bounds: the defaults, the task's, the output kind's, a model spec's own bounds, then this table's
    per-model bounds."""

    def __init__(self, defaults: Mapping[str, Mapping[str, Any]], models: Mapping[str, Mapping[str, Mapping[str, Any]]],
                 tasks: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
                 outputs: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None):
        self.defaults, self.models, self.tasks, self.outputs = defaults, models, tasks or {}, outputs or {}

    @classmethod
    def load(cls, path: Path | None = None) -> "ToleranceTable":
        """The packaged table, with ``path``'s bounds merged over it."""
        defaults: dict[str, dict[str, Any]] = {}
        models: dict[str, dict[str, dict[str, Any]]] = {}
        tasks: dict[str, dict[str, dict[str, Any]]] = {}
        outputs: dict[str, dict[str, dict[str, Any]]] = {}
        for document in layers(path, "tolerances.yaml", ToleranceFile, "tolerance file"):
            for precision, bounds in document.defaults.items():
                defaults.setdefault(precision, {}).update(bounds.given())
            for section, source in ((models, document.models), (tasks, document.tasks), (outputs, document.outputs)):
                for name, per_precision in source.items():
                    for precision, bounds in per_precision.items():
                        section.setdefault(name, {}).setdefault(precision, {}).update(bounds.given())
        return cls(defaults, models, tasks, outputs)

    def samples_to_resolve(self, model: str, spec_overrides: Mapping[str, Mapping[str, Any]],
                           labelled: bool, task: str | None = None) -> int:
        """The fewest evaluation samples on which every top-1 bound of ``model`` (and, for a labelled
        set, every accuracy-drop bound), in any precision, allows at least one sample's change."""
        precisions = {*self.defaults, *spec_overrides, *self.models.get(model, {})}
        bounds = [self.resolve(model, p, spec_overrides, task) for p in precisions]
        return max([samples_to_resolve(b.min_top1, b.max_accuracy_drop if labelled else None) for b in bounds],
                   default=1)

    def resolve(self, model: str, precision: str, spec_overrides: Mapping[str, Mapping[str, Any]],
                task: str | None = None, kind: str | None = None) -> Tolerance:
        """Defaults, then the task's (an embedding is not judged by a logits bound), then the output kind's (nor is
        a probability map: :mod:`quantverdict.judge.output_kinds`), then the model spec's own bounds, then this
        table's per-model bounds."""
        merged: dict[str, Any] = dict(self.defaults.get(precision, {}))
        merged.update(self.tasks.get(task or "", {}).get(precision, {}))
        merged.update(self.outputs.get(kind or "", {}).get(precision, {}))
        merged.update(spec_overrides.get(precision, {}))
        merged.update(self.models.get(model, {}).get(precision, {}))
        return Tolerance(**merged)

