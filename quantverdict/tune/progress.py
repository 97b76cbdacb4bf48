"""What a recipe search says as it goes: the time its remaining candidates take, priced by kind (each candidate's
settings in a line are :meth:`RecipeSettings.words`)."""
from __future__ import annotations

from typing import Callable, Literal, Protocol, Sequence, get_args

import numpy as np

from quantverdict.precision.settings import RecipeSettings
from quantverdict.tune.fallback import RANKED_AS


class Timed(Protocol):
    """A candidate tried: its settings and how long it took."""

    settings: RecipeSettings
    seconds: float


def upcoming(settings: RecipeSettings, options: Sequence[RecipeSettings],
             seen: Sequence[RecipeSettings] = ()) -> list[RecipeSettings]:
    """The candidates ``options`` would make after ``settings``, as far as their cost goes: a share kept wider once
    tried is assumed kept by the stages after it (it usually wins: it removes the most noise); one of ``seen`` (tried
    already: a search does not judge it again) is left out."""
    carried, out = settings, []
    for option in options:
        made = option.over(carried)
        if made not in seen:
            out.append(made)
        if option.fallback:
            carried = made
    return out


# The settings candidates differ in and share one ranking of layers quantized alone: a ranking ignores rounding, share
# and format (:data:`RANKED_AS`), and the calibrators tried after fallback are judged at its layers.
ONE_RANKING_ACROSS = (*RANKED_AS.given(), *RecipeSettings(calibration="max").given())
RANKED_SHARE = 0.5  # a layer quantized alone is evaluated from the cut before it: about half the graph, on average


def ranking_seconds(layers: int, workers: int, pass_s: float) -> float:
    """About how long ranking ``layers`` layers quantized alone takes on ``workers`` workers, before one was timed: each
    layer's graph is evaluated on the calibration set from its cut (:data:`RANKED_SHARE` of the graph), on one thread
    with ONNX Runtime's float optimisations, as one pass of the whole graph over it took (``pass_s``). Priced in plain
    candidates, as it was first, it said 19 s for MobileNetV2's 8 s: a plain candidate builds and evaluates as written a
    graph per fold, a ranking's evaluation of a layer costs its pass alone."""
    return RANKED_SHARE * layers * pass_s / max(workers, 1)


Kind = Literal["plain", "ranks", "rounds", "prepares"]  # a candidate's, by the work it is the first to do (kinds)
NOT_PREPARATION = ("calibration", "fallback", "fallback_format", "gptq")  # the settings a preparation ignores
# Passes' worth of new work a kind pays beyond a plain candidate, in units of what the search's first candidate paid
# beyond one (its FP32 references and the first histograms: about one forward pass over the calibration set): a new
# preparation measures its channel ranges and calibrates its graph afresh; GPTQ's first rounding of a preparation
# measures H (a pass exposing every layer's input, and its products) and rounds every layer on every fold, which took
# 1.7-2.5 such passes on a 2-core runner and 1-1.3 on a 16-core one (the products and the rounding use every core), and
# 0.7 where H and the channel ranges rode the first pass (quantverdict.precision.first_pass: its rounding alone).
PASSES: dict[Kind, float] = {"prepares": 1.0, "rounds": 1.5}


def kinds(settings: Sequence[RecipeSettings]) -> list[Kind]:
    """Each candidate's kind, by the work it is the first to do: ``ranks`` (every layer quantized alone, for a
    preparation not ranked before: the calibrators tried after fallback are judged at its layers), ``rounds`` (GPTQ's H
    for a preparation not rounded before), ``prepares`` (a migration not calibrated before), else ``plain`` (the first
    too: what it pays once prices the others)."""
    ranked: set[RecipeSettings] = set()
    rounded: set[RecipeSettings] = set()
    prepared: set[RecipeSettings] = set()
    found: list[Kind] = []
    for index, each in enumerate(settings):
        by, preparation = each.unset(*ONE_RANKING_ACROSS), each.unset(*NOT_PREPARATION)
        kind: Kind = "plain"
        if each.fallback and by not in ranked:
            kind = "ranks"
        elif each.gptq and preparation not in rounded:
            kind = "rounds"
        elif index and preparation not in prepared:
            kind = "prepares"
        if each.fallback:
            ranked.add(by)
        if each.gptq:
            rounded.add(preparation)
        prepared.add(preparation)
        found.append(kind)
    return found


def time_left(plan: Sequence[RecipeSettings], timed: Sequence[Timed], ranking: Callable[[], float] | None = None,
              maybe: int = 0, ridden: float = 0.0) -> str:
    """About how long the candidates ``plan`` take, each timed as the median of those ``timed`` of its kind
    (:func:`kinds`; the median, since one slow technique should not price the rest). A kind not timed yet is priced as
    a plain candidate and the new work it does (:data:`PASSES`), but for one that ranks layers: it costs several
    others (:func:`quantverdict.tune.fallback.fallback_per_part`) and is priced as a plain candidate and the seconds
    ``ranking()`` says (:func:`ranking_seconds`; asked only then), and said so. The last ``maybe`` of ``plan`` run only
    where the first share of layers tried wider past ``max_fallback`` meets the case's bounds
    (:func:`~quantverdict.tune.beyond.fewest_in_float`, which stops where it misses them): said apart, as the most they
    add. ``ridden``: the seconds the first candidate's calibration pass spent measuring what later ones ask of the
    graph (:mod:`quantverdict.precision.first_pass`): their work, not its own one-time work."""
    of_kind = kinds([*(c.settings for c in timed), *plan])
    took = [c.seconds - (ridden if index == 0 else 0.0) for index, c in enumerate(timed)]
    means = {kind: float(np.median(seconds)) for kind in get_args(Kind)
             if (seconds := [each for each, its in zip(took, of_kind) if its == kind])}
    if "plain" in means:
        one_pass = max(took[0] - means["plain"], 0.0)
        for kind, passes in PASSES.items():
            means.setdefault(kind, means["plain"] + passes * one_pass)
    ahead = of_kind[len(timed):]
    guessed = "ranks" in ahead and "ranks" not in means and "plain" in means and ranking is not None
    if guessed:
        means["ranks"] = means["plain"] + ranking()  # type: ignore[misc]
    sure, unsure = ahead[:len(ahead) - maybe], ahead[len(ahead) - maybe:]
    said = f"about {sum(means[kind] for kind in sure if kind in means):.0f} s left"
    if unsure:
        said += (f", up to {sum(means[kind] for kind in unsure if kind in means):.0f} s more if more layers kept wider "
                 "meet the case's bounds")
    untimed = ahead.count("ranks") if "ranks" not in means or guessed else 0
    if untimed:
        many = untimed > 1
        said += f", {'with ' if guessed else 'and '}{untimed} candidate{'s' if many else ''} that rank" \
                f"{'' if many else 's'} layers, " + ("estimated from one pass of the graph" if guessed else
                                                     "not timed yet")
    unpriced = sum(kind not in means and kind != "ranks" for kind in ahead)  # where no plain one is timed yet
    if unpriced:
        said += f", and {unpriced} candidate{'s' if unpriced > 1 else ''} of a kind not timed yet"
    return said
