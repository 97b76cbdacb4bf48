"""A nightly check that starts from the lock: the locked recipe and its nearest alternatives are judged first, on the
same held-out samples a search judges, and a search runs only where they say one may choose otherwise.

After a change of weights, calibration data or packages, a full search costs as much as the first lock (every
candidate recalibrated, every fallback ranking made again), though it almost always chooses the lock's recipe again.
The check judges the locked recipe as the lock holds it (its settings, and the layers it keeps wider: no ranking) and
the :data:`NEAREST` alternatives its search ranked next when it was locked, those that keep as many layers wider in the
same formats with the lock's layers too: the settings compared at equal layers, and no layer ranked again (a ranking
evaluates each layer quantized alone, the most of a check's time). The lock holds where its recipe still meets
the case's bounds on the held-out samples and neither alternative is :func:`~quantverdict.tune.rules.better` (the
search's own paired test); an alternative that is better is proposed in its place; where the lock's recipe misses the
bounds it met when locked, the full search runs, the locked recipe judged beside its candidates as before. Where it
missed them when locked too (no candidate of that search met them), missing them again is no news: the alternatives
are judged as where it holds, and a search of every candidate is the user's call (``lock --update``). An alternative
races the best judged before it as a search's candidates do: where that one meets the case's bounds, or neither can
(a lock that missed them when locked), the alternative stops after the first fold that puts it
:func:`~quantverdict.tune.rules.out_of_reach` (it could not be better).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from quantverdict.judge.by_kind import ByKind
from quantverdict.judge.workbench import Workbench
from quantverdict.precision.qdq import QDQ
from quantverdict.tune.result import Incumbent, SearchResult
from quantverdict.tune.rules import better
from quantverdict.tune.search import Progress, Trials

NEAREST = 2  # the alternatives a check judges beside the locked recipe: the best others of its search


def check_lock(whole: Workbench, folds: Sequence[Workbench], held_out: Sequence[np.ndarray], model: str, base: QDQ,
               judging: ByKind, incumbent: Incumbent, report: Progress) -> SearchResult | None:
    """The lock's recipe (its settings and its layers kept wider, as the lock holds them) and its nearest alternatives
    judged on the search's folds: a result choosing the lock's recipe where it holds, or the best alternative that
    does better by the search's paired test; None where the lock's recipe misses the case's bounds it met when locked (a
    search says)."""
    trials = Trials(whole, folds, held_out, model, base, judging, report)
    result = SearchResult(chosen=incumbent.settings, held_out_samples=trials.samples, folds=len(folds),
                          layers=trials.layers)
    trials.planned = 1 + len(incumbent.nearest)
    report(f"recipe search {model} {base.name}: checking the lock first: its recipe and the {len(incumbent.nearest)} "
           f"alternatives nearest to it, on {len(folds)} folds of {result.held_out_samples} calibration samples")
    kept = None if incumbent.kept is None else [dict(incumbent.kept)] * len(folds)
    result.incumbent, locked = trials.judge(incumbent.settings, list(incumbent.nearest), kept=kept)
    still_missed = not result.incumbent.passed and incumbent.met_bounds is False
    if locked is None or not (result.incumbent.passed or still_missed):
        report(f"recipe search {model} {base.name}: the lock's recipe misses the case's bounds on held-out samples: "
               "searching")
        return None
    best, at_locked_layers = (result.incumbent, locked), True
    for index, option in enumerate(incumbent.nearest):
        same_share = option.fallback_formats() == incumbent.settings.fallback_formats() and \
            option.fallback == incumbent.settings.fallback
        candidate, samples = trials.judge(option, list(incumbent.nearest[index + 1:]),
                                          [result.incumbent, *result.candidates], kept=kept if same_share else None,
                                          rival=best)
        result.candidates.append(candidate)
        if samples is not None and better(samples, best[1], candidate.passed, best[0].passed):
            best, at_locked_layers = (candidate, samples), same_share
    result.chosen, result.beats_incumbent = best[0].settings, best[0] is not result.incumbent
    if at_locked_layers:  # what it proposes is what it judged: the lock's layers, not a ranking made again
        result.kept = incumbent.kept
    result.note = (f"checked from the lock: {best[0].settings.words()} does better than the lock's recipe on held-out "
                   "samples by the search's paired test (a search of every candidate: quantverdict lock --update "
                   f"{model})" if result.beats_incumbent else
                   f"checked from the lock: its recipe {'misses' if still_missed else 'meets'} the case's bounds on "
                   f"held-out samples{', as it did when locked,' if still_missed else ''} and none of the "
                   f"{len(incumbent.nearest)} alternatives nearest to it does better, so no wider search"
                   + (f" (a search of every candidate: quantverdict lock --update {model})" if still_missed else ""))
    result.passed_if = trials.passed_if
    return result
