"""Timing done right: warm-up, device synchronisation, many repeats, median and percentiles.

- ``time_call``: any callable; ``synchronize`` runs inside the timed region, so asynchronous GPU
  work is never timed as a launch only. Used for per-case latency (host arrays in and out, so
  host↔device copies included). It keeps what a few timed calls returned, so the outputs of
  the timed configuration can be judged too (:mod:`quantverdict.judge.timed`).
- ``time_cuda``: compute only, with CUDA events around the call on the current stream, inputs
  rotated among several device buffers so caches do not flatter the result.
- ``interleaved_ratio``: two variants timed alternately, round after round, so drift and noise
  hit both alike; the spread of the per-round ratios is the noise estimate a floor is judged by.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

WARMUP = 3  # calls per warm-up window
REPEATS = 20
STABLE = 0.05  # warm-up ends when two consecutive windows' medians agree within 5%
MAX_WARMUP_WINDOWS = 10


def warm_up(call: Callable[[], Any], window: int = WARMUP, sync: Callable[[], None] = lambda: None) -> int:
    """Call until timings settle (lazy initialisation, autotuning, caches); returns the calls made."""
    previous = None
    for windows in range(1, MAX_WARMUP_WINDOWS + 1):
        samples = []
        for _ in range(window):
            start = time.perf_counter()
            call()
            sync()
            samples.append(time.perf_counter() - start)
        current = float(np.median(samples))
        if previous is not None and abs(current - previous) <= STABLE * previous:
            return windows * window
        previous = current
    return MAX_WARMUP_WINDOWS * window


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    repeats: int
    items_per_s: float
    # what some timed calls returned (MLPerf TEST01): checked against the accuracy pass, never serialised
    sampled: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "sampled"}


def _summary(samples_ms: np.ndarray, items: int, sampled: tuple[Any, ...] = ()) -> Timing:
    median = float(np.median(samples_ms))
    return Timing(median, float(np.percentile(samples_ms, 90)), float(np.percentile(samples_ms, 99)),
                  float(samples_ms.min()), len(samples_ms), items / (median / 1e3), sampled)


SAMPLED = 3  # timed calls whose outputs are kept: the first, the middle and the last


def sample_positions(repeats: int, count: int = SAMPLED) -> set[int]:
    """Evenly spread positions in a timed loop (first and last included) whose outputs are kept."""
    return {int(round(i)) for i in np.linspace(0, repeats - 1, min(count, repeats))} if count > 0 else set()


SLOWDOWN = "QUANTVERDICT_BENCH_SLOWDOWN_MS"


def with_slowdown(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` with a sleep of ``QUANTVERDICT_BENCH_SLOWDOWN_MS`` before each call, if set: a known slowdown,
    to prove that the benchmark gates and the history analysis see it."""
    delay = float(os.environ.get(SLOWDOWN, "0") or 0) / 1e3
    if delay <= 0:
        return call

    def slowed() -> Any:
        time.sleep(delay)
        return call()

    return slowed


def time_call(call: Callable[[], Any], items: int = 1, warmup: int = WARMUP, repeats: int = REPEATS,
              synchronize: Callable[[], None] | None = None, sampled: int = SAMPLED) -> Timing:
    """Time ``call`` ``repeats`` times after warming up in windows of ``warmup`` calls until stable.

    The results of ``sampled`` of the timed calls are kept (a reference: no copy inside the timed
    region) in ``Timing.sampled``, so a caller can check that what ran fast is what was judged."""
    call = with_slowdown(call)
    sync = synchronize or (lambda: None)
    warm_up(call, warmup, sync)
    samples = np.empty(repeats)
    keep, kept = sample_positions(repeats, sampled), []
    for i in range(repeats):
        start = time.perf_counter()
        result = call()
        sync()
        samples[i] = (time.perf_counter() - start) * 1e3
        if i in keep:
            kept.append(result)
    return _summary(samples, items, tuple(kept))


def time_cuda(fn: Callable[[Any], Any], inputs: Sequence[Any], items: int, warmup: int = 10,
              repeats: int = 50, graph: bool = False, sampled: int = SAMPLED) -> Timing:
    """Device time of ``fn(x)`` with CUDA events, rotating through ``inputs`` (device tensors).

    With ``graph``, one CUDA graph per input is captured and replayed, which removes the launch
    gaps that dominate small batches. ``Timing.sampled`` holds the outputs of ``sampled`` timed
    calls on ``inputs[0]`` (a replayed graph's output copied after the call's end event, so the
    copy is not timed)."""
    import torch

    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    run: Callable[[int], Any] = lambda i: fn(inputs[i % len(inputs)])  # noqa: E731
    if graph:
        graphs, static = [], []
        for x in inputs:
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):
                static.append(fn(x))
            graphs.append(captured)

        def replay(i: int) -> Any:
            graphs[i % len(graphs)].replay()
            return static[i % len(graphs)]

        run = replay
        for i in range(len(graphs)):
            run(i)
        torch.cuda.synchronize()
    rotation = len(inputs)
    keep = {rotation * j for j in sample_positions(-(-repeats // rotation), sampled)}
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    kept = []
    for i in range(repeats):
        starts[i].record()
        out = run(i)
        ends[i].record()
        if i in keep:
            kept.append(out.clone() if graph else out)
    torch.cuda.synchronize()
    return _summary(np.array([s.elapsed_time(e) for s, e in zip(starts, ends)]), items, tuple(kept))


@dataclass(frozen=True)
class Ratio:
    """How many times faster ``fast`` ran than ``base``: median and the spread over rounds."""

    median: float
    low: float
    high: float
    rounds: int

    def below(self, floor: float) -> bool:
        """True only when the whole interval is under the floor (noise alone cannot fail it)."""
        return self.high < floor


def interleaved_ratio(base: Callable[[], Timing], fast: Callable[[], Timing], rounds: int = 5) -> Ratio:
    ratios = []
    for _ in range(rounds):
        ratios.append(base().median_ms / fast().median_ms)
    return Ratio(float(np.median(ratios)), float(min(ratios)), float(max(ratios)), rounds)
