"""What a recipe search says as it goes: the time its remaining candidates take, priced by kind (each candidate's
settings in a line are :meth:`RecipeSettings.words`)."""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from quantverdict.precision.settings import RecipeSettings
from quantverdict.tune.fallback import RANKED_AS


class Timed(Protocol):
    """A candidate tried: its settings and how long it took."""

    settings: RecipeSettings
    seconds: float


def upcoming(settings: RecipeSettings, options: Sequence[RecipeSettings]) -> list[RecipeSettings]:
    """The candidates ``options`` would make after ``settings``, as far as their cost goes: a share kept wider once
    tried is assumed kept by the stages after it (it usually wins: it removes the most noise)."""
    carried, out = settings, []
    for option in options:
        out.append(option.over(carried))
        if option.fallback:
            carried = option.over(carried)
    return out


# The settings candidates differ in and share one ranking of layers quantized alone: a ranking ignores rounding, share
# and format (:data:`RANKED_AS`), and the calibrators tried after fallback are judged at its layers.
ONE_RANKING_ACROSS = (*RANKED_AS.given(), *RecipeSettings(calibration="max").given())
RANKED_SHARE = 0.5  # a layer quantized alone is evaluated from the cut before it: about half the graph, on average


def ranking_factor(layers: int, workers: int) -> float:
    """How many plain candidates' time ranking ``layers`` layers quantized alone takes on ``workers`` workers, before
    one was timed: each layer's graph is evaluated on the whole calibration set (what a plain candidate evaluates
    over its folds) from its cut (:data:`RANKED_SHARE` of the graph), the workers sharing them."""
    return RANKED_SHARE * layers / max(workers, 1)


def time_left(plan: Sequence[RecipeSettings], timed: Sequence[Timed], ranking: float | None = None) -> str:
    """About how long the candidates ``plan`` take, each timed as the median of those ``timed`` of its kind (the first
    carries the search's one-time work, its FP32 references, and one slow technique should not price the rest): one that
    keeps layers wider with a preparation no candidate before it ranked layers for (the calibrators tried after
    fallback are judged at its layers) ranks every layer quantized alone and costs several others
    (:func:`quantverdict.tune.fallback.fallback_per_part`); until one is timed, it is priced as a plain candidate and
    ``ranking`` (:func:`ranking_factor`) times one, and said so."""
    ranked: list[RecipeSettings] = []
    kinds = []
    for settings in [*(c.settings for c in timed), *plan]:
        by = settings.unset(*ONE_RANKING_ACROSS)
        ranks = bool(settings.fallback) and by not in ranked
        kinds.append(ranks)
        if ranks:
            ranked.append(by)
    means = {kind: float(np.median(seconds)) for kind in (False, True)
             if (seconds := [c.seconds for c, ranks in zip(timed, kinds) if ranks == kind])}
    guessed = True not in means and False in means and ranking is not None
    if guessed:
        means[True] = means[False] * (1 + ranking)  # type: ignore[operator]
    ahead = kinds[len(timed):]
    said = f"about {sum(means[kind] for kind in ahead if kind in means):.0f} s left"
    untimed = ahead.count(True) if True not in means or guessed else 0
    if untimed:
        many = untimed > 1
        said += f", {'with ' if guessed else 'and '}{untimed} candidate{'s' if many else ''} that rank" \
                f"{'' if many else 's'} layers, " + ("estimated from the layers' count" if guessed else "not timed yet")
    return said
