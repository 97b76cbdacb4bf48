"""Outputs produced inside a timed loop, checked against the accuracy pass (MLPerf's TEST01).

A speedup is only worth posting if the configuration that was timed computes what was judged:
a runtime that switches engines, skips work or reads stale buffers once it is warm would
otherwise post a speedup with outputs nobody looked at. Each sampled output is compared with
the accuracy pass's output for the same input. Bitwise equal is the expected case for a
deterministic runtime; where they differ (non-deterministic GPU reductions, say), the sampled
output must itself meet the case's tolerance against the FP32 reference, as TEST01 re-scores
non-identical performance-mode outputs with the accuracy script.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from quantverdict.judge.compare import Comparison, compare
from quantverdict.judge.tolerances import Tolerance


@dataclass(frozen=True)
class TimedOutputs:
    samples: int
    identical: int  # sampled outputs equal to the accuracy pass's, element for element
    max_abs_diff: float  # largest |sampled − accuracy pass| over every sample and output
    failing: Comparison | None  # the first non-identical sample that misses the tolerance

    @property
    def passed(self) -> bool:
        return self.failing is None

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "identical": self.identical, "max_abs_diff": self.max_abs_diff,
                "passed": self.passed}

    def explain(self) -> str:
        text = (f"outputs sampled inside the timed loop are not what was judged: {self.samples - self.identical} of "
                f"{self.samples} differ from the accuracy pass on the same input (max |diff| {self.max_abs_diff:.3g})")
        if self.failing is not None:
            text += " and miss the case's tolerance against the FP32 reference:\n" + self.failing.explain()
        return text


def judge_timed_outputs(judged: dict[str, np.ndarray], sampled: Sequence[dict[str, np.ndarray]],
                        reference: dict[str, np.ndarray], tolerance: Tolerance,
                        classification: bool = False) -> TimedOutputs:
    """``judged``: the accuracy pass's outputs for the timed input; ``sampled``: what timed calls
    returned for that input; ``reference``: the FP32 outputs for it."""
    identical, worst, failing = 0, 0.0, None
    for outputs in sampled:
        diffs = [_max_abs_diff(judged[name], outputs.get(name)) for name in judged]
        if all(d == 0.0 for d in diffs):
            identical += 1
            continue
        worst = max(worst, *diffs)
        verdict = compare(reference, {k: np.asarray(v) for k, v in outputs.items()}, tolerance, classification)
        if failing is None and not verdict.passed:
            failing = verdict
    return TimedOutputs(len(sampled), identical, worst, failing)


def _max_abs_diff(judged: np.ndarray, sampled: Any) -> float:
    """0 when equal element for element (NaNs where the accuracy pass had them included); inf for a missing
    output, another shape or a NaN the accuracy pass did not have."""
    if sampled is None or np.shape(sampled) != judged.shape:
        return float("inf")
    a, b = judged.astype(np.float64), np.asarray(sampled, np.float64)
    if np.array_equal(a, b, equal_nan=True):
        return 0.0
    diff = np.abs(b - a)
    diff[np.isnan(a) & np.isnan(b)] = 0.0
    return float(np.max(np.where(np.isnan(diff), np.inf, diff)))
