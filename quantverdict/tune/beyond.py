"""What the case's bounds would take past the user's ``max_fallback``, where a search's choice misses them: the fewest
layers kept in a wider format that meet them on the held-out samples, found with as few tries as bisection allows, and
the sentence that says so."""
from __future__ import annotations

import math
from typing import Callable, Sequence

from quantverdict.tune.result import Candidate
from quantverdict.tune.fallback import layers_kept
from quantverdict.precision.settings import RecipeSettings, formats_words
from quantverdict.tune.auto import AutoSettings

BEYOND = 0.5  # the largest share of layers kept wider tried past max_fallback where the choice misses the case's bounds
MISSES = ("the choice misses the case's bounds on held-out calibration samples (a lower bound by one standard error of "
          "the evaluation's estimate)")


def fewest_in_float(judge: Callable[[float], Candidate], layers: int, max_fallback: float,
                    in_time: Callable[[], bool], widest: Callable[[float], Candidate] | None = None) -> list[Candidate]:
    """Past ``max_fallback``, the fewest of ``layers`` kept wider that meet the case's bounds on the held-out samples,
    each count judged by ``judge(share)``: :data:`BEYOND` of them first (where that misses, so does every fewer, as far
    as more layers kept wider never do worse), then by bisection between the user's share and the fewest known to meet.
    The layers' ranking is the choice's own, read from the cache after the first: each try costs its folds.

    ``widest`` judges a share with every layer kept in the widest format offered, where several are: tried first, at
    :data:`BEYOND`, as it evaluates no layer alone in a narrower one (on MobileNetV2, 21 such layers were 5 of the 6 s
    of a try); where it misses, so does every mix of narrower formats, as far as a narrower one never does better (a
    few layers' FP16 rounding may cancel a little noise: MobileNetV2's half scored 19.49 dB in FP32, 19.51 dB in
    FP16/FP32), and nothing more is tried."""
    low, high = beyond_counts(layers, max_fallback)
    tried: list[Candidate] = []
    if widest is not None and high > low and in_time():
        tried.append(widest(share_of(high, layers)))
        if not tried[-1].passed:
            return tried
    first = len(tried)
    while high > low + (1 if len(tried) > first else 0) and in_time():
        count = (low + high) // 2 if len(tried) > first else high
        tried.append(judge(share_of(count, layers)))
        if not tried[-1].passed and count == high:
            break
        low, high = (low, count) if tried[-1].passed else (count, high)
    return tried


def share_of(count: int, layers: int) -> float:
    """The share of ``layers`` that keeps ``count`` of them wider (fallback floors share × layers), in four
    decimals, within two steps of count / layers: 2 of 4 is 0.5, 13 of 48 is 0.2709."""
    share = math.ceil(count / layers * 10_000) / 10_000
    while layers_kept(share, layers) < count:
        share += 1e-4
    return share


def beyond_counts(layers: int, max_fallback: float) -> tuple[int, int]:
    """The layers kept wider the user allows, and the most :func:`fewest_in_float` tries."""
    return layers_kept(max_fallback, layers), layers_kept(BEYOND, layers)


def beyond_plan(over: RecipeSettings, layers: int, auto: AutoSettings) -> list[RecipeSettings]:
    """The most candidates :func:`fewest_in_float` judges past ``over`` (the largest share in the widest format where
    several are offered, in them all, then bisection), as far as their cost goes: a search's time left counts them
    while its best misses the case's bounds."""
    low, high = beyond_counts(layers, auto.max_fallback)
    tries = (high > low) + max(0, high - low - 1).bit_length()
    most = RecipeSettings(fallback=share_of(high, layers), fallback_format=auto.wider_formats).over(over)
    widest = [RecipeSettings(fallback=share_of(high, layers), fallback_format=auto.wider_formats[-1:]).over(over)] \
        if high > low and len(auto.wider_formats) > 1 else []
    return widest + [most] * tries


def beyond_note(beyond: Sequence[Candidate], layers: int, max_fallback: float) -> str:
    """What the case's bounds need on held-out calibration samples, in layers kept in a wider format, against what
    the user allows (``max_fallback``)."""
    def kept(candidate: Candidate) -> str:
        count = layers_kept(candidate.settings.fallback or None, layers)
        wider = formats_words(candidate.settings.fallback_formats()).upper()
        return f"{count} of the {layers} weighted layers in {wider} ({count / layers:.0%})"

    met = [candidate for candidate in beyond if candidate.passed]
    allowed = f"max_fallback is {max_fallback:.0%}"
    if met:
        fewest = min(met, key=lambda candidate: candidate.settings.fallback or 0.0)
        return (f"{MISSES}; keeping {kept(fewest)} meets "
                f"them ({fewest.score_db:.2f} dB), the fewest found; {allowed}")
    if not beyond:
        return f"{MISSES}; {allowed}"
    return (f"{MISSES}, and so does keeping "
            f"{kept(max(beyond, key=lambda candidate: candidate.settings.fallback or 0.0))}; {allowed}")