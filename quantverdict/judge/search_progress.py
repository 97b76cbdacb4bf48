"""What a recipe search says as it goes: each candidate's settings in a line, and the time its remaining candidates
take, priced by kind."""
from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

import numpy as np


class Timed(Protocol):
    """A candidate tried: its settings and how long it took."""

    settings: dict[str, Any]
    seconds: float


def upcoming(settings: Mapping[str, Any], options: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The candidates ``options`` would make after ``settings``, as far as their cost goes: a share kept in FP32
    once tried is assumed kept by the stages after it (it usually wins: it removes the most noise)."""
    carried, out = dict(settings), []
    for option in options:
        out.append({**carried, **option})
        if option.get("fallback"):
            carried["fallback"] = option["fallback"]
    return out


def time_left(plan: Sequence[Mapping[str, Any]], timed: Sequence[Timed]) -> str:
    """About how long the candidates ``plan`` take, each timed as the mean of those ``timed`` of its kind: one that
    keeps layers in FP32 ranks every layer quantized alone and costs several others."""
    def ranks(settings: Mapping[str, Any]) -> bool:
        return bool(settings.get("fallback"))

    means = {kind: float(np.mean(seconds)) for kind in (False, True)
             if (seconds := [c.seconds for c in timed if ranks(c.settings) == kind])}
    untimed = [settings for settings in plan if ranks(settings) not in means]
    left = sum(means[ranks(settings)] for settings in plan if ranks(settings) in means)
    count = f"{len(untimed)} candidate{'s' if len(untimed) > 1 else ''}"
    return f"about {left:.0f} s left" + (f", and {count} that rank layers, not timed yet" if untimed else "")


def describe(settings: Mapping[str, Any]) -> str:
    """``calibration=percentile smoothquant=0.5`` for a progress line."""
    return " ".join(f"{key}={value}" for key, value in settings.items()) or "defaults"
