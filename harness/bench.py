"""Latency measurement: warm-up, many repeats, median and percentiles, device synchronisation.

The timed call includes host↔device copies (a runner's ``infer`` takes and returns host arrays);
``synchronize`` (e.g. ``torch.cuda.synchronize``) runs inside the timed region so asynchronous
GPU work is never timed as a launch only.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

WARMUP = 3
REPEATS = 20


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    repeats: int
    items_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_call(call: Callable[[], Any], items: int = 1, warmup: int = WARMUP, repeats: int = REPEATS,
              synchronize: Callable[[], None] | None = None) -> Timing:
    """Time ``call`` ``repeats`` times after ``warmup`` untimed calls."""
    sync = synchronize or (lambda: None)
    for _ in range(warmup):
        call()
    sync()
    samples = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        call()
        sync()
        samples[i] = (time.perf_counter() - start) * 1e3
    median = float(np.median(samples))
    return Timing(median, float(np.percentile(samples, 90)), float(np.percentile(samples, 99)), float(samples.min()),
                  repeats, items / (median / 1e3))
