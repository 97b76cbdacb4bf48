"""A model's outputs judged each by the bounds of what it is: the one comparison a case's verdict and a recipe search
make, so that a search's candidate meets the bounds the verdict will hold it to (a search that judged a detector's
raw head and a verdict that judged its detections could disagree)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from quantverdict.judge.compare import Comparison, compare
from quantverdict.judge.layer_errors import View, views_of, whole
from quantverdict.judge.map_decisions import DEFAULT_THRESHOLD
from quantverdict.judge.tolerances import Tolerance, ToleranceTable
from quantverdict.models.spec import ModelSpec


@dataclass(frozen=True)
class ByKind:
    """``spec``'s outputs and their kinds (:mod:`quantverdict.judge.output_kinds`), the case's ``tolerance`` and each
    output's own bounds where its kind has them."""

    spec: ModelSpec
    kinds: Mapping[str, str]
    tolerance: Tolerance
    bounds: Mapping[str, Tolerance]

    @classmethod
    def of(cls, spec: ModelSpec, kinds: Mapping[str, str], table: ToleranceTable, precision: str,
           tolerance: Tolerance) -> "ByKind":
        bounds = {name: table.resolve(spec.name, precision, spec.tolerances, spec.task, kind)
                  for name, kind in kinds.items() if kind != "logits"}
        return cls(spec, dict(kinds), tolerance, bounds)

    def compare(self, reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
                undecided: np.ndarray | None = None) -> Comparison:
        """``outputs`` against FP32's ``reference`` (the declared outputs: the caller's to choose), each under its
        kind's bounds: a distribution at each position, a probability map by its region and peak at its threshold, a
        detector head by its detections, a sequence by what it decodes to, labels by how many agree."""
        spec, kinds = self.spec, self.kinds
        return compare(reference, outputs, self.tolerance, spec.task == "classification", undecided, self.bounds,
                       frozenset(name for name, kind in kinds.items() if kind == "distribution"),
                       {name: spec.thresholds.get(name, DEFAULT_THRESHOLD) for name, kind in kinds.items()
                        if kind == "probabilities"}, spec.detections, spec.sequences,
                       frozenset(name for name, kind in kinds.items() if kind == "labels"))

    def scored(self, name: str, reference: np.ndarray) -> View:
        """What a recipe search scores of output ``name``, given FP32's ``reference`` on its held-out samples: what
        the case's errors of it are taken on (:func:`~quantverdict.judge.layer_errors.views_of`: a detector head's
        anchors FP32 keeps, so that a score is the verdict's ``snr_db``; the whole head counted box offsets of anchors
        no threshold keeps, and on ddddocr's YOLOX head preferred the recipe whose detections were the worse), any
        other output as it is: ``scored(name, reference)(values)``, of a candidate's first samples or the reference."""
        return views_of(self.spec.detections, {name: reference}).get(name, whole)
