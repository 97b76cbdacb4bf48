"""Judging outputs a user computed themselves (their own engine, their own reference) under a
precision's tolerances: the ``quantverdict`` pytest fixture, and usable without pytest.

    def test_my_engine(quantverdict):
        quantverdict.check(reference, outputs, "int8", name="my-net", task="classification")
"""
from __future__ import annotations

from typing import Any, Callable, Literal, Mapping

import numpy as np

from quantverdict.judge.compare import Comparison, compare, judge_task_metrics
from quantverdict.judge.task_metrics import embedding_agreement
from quantverdict.judge.tolerances import ToleranceTable
from quantverdict.precision import get_recipe
from quantverdict.run.cases import Case, CaseResult

Outputs = Mapping[str, np.ndarray] | np.ndarray


class OutputJudge:
    """``check`` judges one pair of outputs; each verdict is also handed to ``record`` (the run record)."""

    def __init__(self, tolerances: ToleranceTable, record: Callable[[CaseResult], None] | None = None):
        self.tolerances, self.record = tolerances, record

    def check(self, reference: Outputs, outputs: Outputs, precision: str, *, name: str = "outputs",
              backend: str = "user", task: Literal["regression", "classification", "embedding"] = "regression",
              bounds: Mapping[str, Any] | None = None) -> Comparison:
        """Outputs (arrays, or name → array, batch first) against the reference under ``precision``'s
        tolerances (the table's defaults, its bounds for a model called ``name``, then ``bounds``);
        raises AssertionError with the failed bounds and worst elements, else returns the comparison."""
        __tracebackhide__ = True
        get_recipe(precision)  # an unknown precision is named, with the closest one
        ref, out = _named(reference), _named(outputs)
        tolerance = self.tolerances.resolve(name, precision, {precision: dict(bounds or {})}, task)
        comparison = compare(ref, out, tolerance, task == "classification")
        if task == "embedding":
            judge_task_metrics(embedding_agreement(ref, out, None), tolerance, comparison)
        case = Case(name, precision, backend)
        message = "" if comparison.passed else f"{case.id} vs reference:\n{comparison.explain()}"
        if self.record is not None:
            self.record(CaseResult(case, "passed" if comparison.passed else "failed", message, comparison.to_dict(),
                                   tolerance.to_dict()))
        if not comparison.passed:
            raise AssertionError(message)
        return comparison


def _named(values: Outputs) -> dict[str, np.ndarray]:
    return {"output": np.asarray(values)} if isinstance(values, np.ndarray) else \
        {name: np.asarray(array) for name, array in values.items()}
