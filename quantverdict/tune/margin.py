"""The margin a recipe search keeps over the case's lower bounds: one standard error of the evaluation's estimate.

A recipe that meets a bound exactly on the held-out calibration samples meets it on the evaluation set about half the
time, since the evaluation's estimate varies with its own samples. The search takes a candidate as meeting a lower bound
(``min_top1``, ``min_cosine``) only where its held-out estimate clears the bound by one standard error of the same
metric measured on as many samples as the evaluation set holds: its 95% interval on the held-out samples (exact for a
proportion, bootstrapped for cosine: :mod:`quantverdict.judge.intervals`) narrowed from their count to the
evaluation's, over the bound as the case resolves it there (``min_top1`` 0.97 on 8 samples allows one of them). Where
the held-out estimate is the true value, the case then passes about five times in six (84%).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from quantverdict.judge.intervals import resolve_agreement_bound
from quantverdict.judge.tolerances import Tolerance

Z95 = 1.959964  # a 95% interval's half-width in standard errors
LOWER_BOUNDS = {"min_top1": ("top1_agreement", "top1_samples"), "min_cosine": ("cosine", "samples")}


def evaluation_error(interval: Mapping[str, float], held_out: int, evaluation: int) -> float:
    """One standard error of a metric on ``evaluation`` samples, from its 95% ``interval`` on ``held_out`` samples."""
    if held_out <= 0 or evaluation <= 0:
        return 0.0
    return (interval["high"] - interval["low"]) / (2 * Z95) * math.sqrt(held_out / evaluation)


def short_of_margin(metrics: Mapping[str, Mapping[str, Any]], tolerance: Tolerance, evaluation: int) -> list[str]:
    """The lower bounds that each output's held-out metrics (:func:`quantverdict.judge.compare.compare`'s) do not clear
    by :func:`evaluation_error`, as ``output: min_top1 0.97 needs 0.9775, held out 0.9740``."""
    short = []
    for output, values in metrics.items():
        for bound_name, (metric, count) in LOWER_BOUNDS.items():
            bound, interval = getattr(tolerance, bound_name), values.get("intervals", {}).get(metric)
            if bound is None or interval is None or metric not in values:
                continue
            if bound_name == "min_top1" and evaluation > 0:  # as the case resolves it on the evaluation set
                bound = resolve_agreement_bound(bound, evaluation, bound_name).used
            needed = bound + evaluation_error(interval, int(values.get(count, 0)), evaluation)
            if values[metric] < needed:
                short.append(f"{output}: {bound_name} {bound:g} needs {needed:.4f}, held out {values[metric]:.4f}")
    return short
