"""A nightly check that starts from the lock: the locked recipe and its nearest alternatives are judged first, on the
same held-out samples a search judges, and a search runs only where they say one may choose otherwise.

After a change of weights, calibration data or packages, a full search costs as much as the first lock (every
candidate recalibrated, every fallback ranking made again), though it almost always chooses the lock's recipe again.
The check judges the locked recipe and the :data:`NEAREST` alternatives its search ranked next when it was locked: the
lock holds where its recipe still meets the case's bounds on the held-out samples and neither alternative is
:func:`~quantverdict.tune.search.better` (the search's own paired test); otherwise the full search runs, with the
locked recipe judged beside its candidates as before (what was judged is read from the cache, not judged again).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from quantverdict.judge.sensitivity import weighted_layers
from quantverdict.judge.tolerances import Tolerance
from quantverdict.judge.workbench import Workbench
from quantverdict.precision.qdq import QDQ
from quantverdict.tune.result import Incumbent, SearchResult
from quantverdict.tune.search import Progress, Trials, better

NEAREST = 2  # the alternatives a check judges beside the locked recipe: the best others of its search


def check_lock(whole: Workbench, folds: Sequence[Workbench], held_out: Sequence[np.ndarray], model: str, base: QDQ,
               tolerance: Tolerance, incumbent: Incumbent, report: Progress) -> SearchResult | None:
    """The lock's recipe and its nearest alternatives judged on the search's folds: a result choosing the lock's
    recipe where it holds, None where a search must say (it misses the bounds, or an alternative does better)."""
    trials = Trials(whole, folds, held_out, model, base, tolerance, report)
    result = SearchResult(chosen=incumbent.settings, held_out_samples=trials.samples, folds=len(folds),
                          layers=len(weighted_layers(folds[0], model, base)))
    trials.planned = 1 + len(incumbent.nearest)
    report(f"recipe search {model} {base.name}: checking the lock first: its recipe and the {len(incumbent.nearest)} "
           f"alternatives nearest to it, on {len(folds)} folds of {result.held_out_samples} calibration samples")
    result.incumbent, kept = trials.judge(incumbent.settings, list(incumbent.nearest))
    if kept is None or not result.incumbent.passed:
        report(f"recipe search {model} {base.name}: the lock's recipe misses the case's bounds on held-out samples: "
               "searching")
        return None
    for index, option in enumerate(incumbent.nearest):
        candidate, samples = trials.judge(option, list(incumbent.nearest[index + 1:]), result.candidates)
        result.candidates.append(candidate)
        if samples is not None and better(samples, kept, candidate.passed, result.incumbent.passed):
            report(f"recipe search {model} {base.name}: {option.words()} does better than the lock's recipe: "
                   "searching")
            return None
    result.beats_incumbent = False
    result.note = (f"checked from the lock: its recipe meets the case's bounds on held-out samples and none of the "
                   f"{len(incumbent.nearest)} alternatives nearest to it does better, so no wider search")
    return result
