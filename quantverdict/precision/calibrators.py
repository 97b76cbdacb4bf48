"""Activation-range calibrators over a streaming histogram of |x|.

The histogram is filled batch by batch (``Histogram.add``) and grows its range by re-binning
when a batch exceeds it, so no activation is held in memory. Each method turns the histogram
(and the exact running max) into one ``amax`` per tensor:

- ``max``: the largest |x| seen.
- ``entropy``: TensorRT's EntropyCalibration2 — the clipping threshold whose 128-level
  quantized distribution has the least KL divergence from the clipped reference.
- ``percentile``: the given percentile of |x| (e.g. 99.99).
- ``mse``: the threshold minimising expected squared error (clipping + rounding) on the
  symmetric 8-bit grid, or on FP8 E4M3's (``grid="e4m3"``, what FP8 recipes use).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import ml_dtypes
import numpy as np

BINS = 2048
QUANT_LEVELS = 128  # levels of a signed 8-bit grid on one side of zero
E4M3_MAX = 448.0  # FP8 E4M3's largest finite value
CHUNK = 1 << 16  # values binned at a time


class Histogram:
    """Counts of |x| in ``BINS`` equal bins over ``[0, limit]``, plus the exact max.

    With ``bins=0`` only the max is tracked (all the ``max`` method needs).
    """

    def __init__(self, bins: int = BINS):
        self.counts = np.zeros(bins, dtype=np.float64)
        self.limit = 0.0
        self.max = 0.0

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(0.0, self.limit, len(self.counts) + 1)

    def add(self, values: np.ndarray) -> None:
        add_to([self], values)

    def grow(self, new_limit: float) -> None:
        """The range widened to ``new_limit``, each bin's count moved to the bin its centre falls in."""
        if self.limit > 0 and self.counts.any():
            centers = (np.arange(len(self.counts)) + 0.5) * (self.limit / len(self.counts))
            index = np.minimum((centers / new_limit * len(self.counts)).astype(int), len(self.counts) - 1)
            self.counts = np.bincount(index, weights=self.counts, minlength=len(self.counts)).astype(np.float64)
        self.limit = new_limit


def add_to(histograms: Sequence[Histogram], values: np.ndarray) -> None:
    """``values``' |x| added to each of ``histograms`` (one tensor's, of several sets of batches that hold this one):
    binned once for all of them whose range is the same, as each would bin it alone."""
    values = values.astype(np.float32, copy=False).reshape(-1)
    if values.size == 0:
        return
    batch_max = float(np.maximum(values.max(), -values.min()))  # max |x|, a tensor's size in no temporary
    finite, finite_max = values, batch_max
    if not np.isfinite(batch_max):  # an overflowed activation: its max says so; the bins hold the rest
        finite = np.abs(values[np.isfinite(values)])
        finite_max = float(finite.max()) if finite.size else 0.0
    binned: dict[tuple[int, float], np.ndarray] = {}  # the counts over [0, limit] in so many bins
    for hist in histograms:
        hist.max = max(hist.max, batch_max)
        if len(hist.counts) == 0 or finite.size == 0:
            continue
        if finite_max > hist.limit:
            hist.grow(finite_max)
        if hist.limit == 0.0:
            hist.counts[0] += finite.size
            continue
        shape = (len(hist.counts), hist.limit)
        if shape not in binned:
            binned[shape] = _counts(finite, *shape)
        hist.counts += binned[shape]


def _counts(values: np.ndarray, bins: int, limit: float) -> np.ndarray:
    """How many of ``|values|`` (float32, within ``[0, limit]``) fall in each of ``bins`` equal bins: the bin is the
    float32 product's integer part, correctly rounded on every CPU (a value within its last bit of an edge may count in
    the bin above; ``np.histogram``'s edge checks take 2.4× as long). :data:`CHUNK` values at a time, in buffers that
    stay in the CPU's cache: a tensor-sized temporary is fresh memory the kernel must map, page by page, each batch
    (38M values of an activation binned with fresh temporaries took 1.2 s, in these buffers 0.11 s)."""
    per_unit = bins / limit
    wide = per_unit >= float(np.finfo(np.float32).max)  # a range of subnormals: the factor would overflow float32
    counts = np.zeros(bins, np.intp)  # each bin's index fits int32, which halves the bytes bincount reads
    magnitude, index = np.empty(min(CHUNK, values.size), np.float32), np.empty(min(CHUNK, values.size), np.int32)
    for start in range(0, values.size, CHUNK):
        part = values[start:start + CHUNK]
        held, at = magnitude[:part.size], index[:part.size]
        np.abs(part, out=held)
        scaled = held.astype(np.float64) * per_unit if wide else np.multiply(held, np.float32(per_unit), out=held)
        np.copyto(at, scaled, casting="unsafe")  # the integer part, as ``astype`` takes it
        np.minimum(at, bins - 1, out=at)
        counts += np.bincount(at, minlength=bins)
    return counts


@dataclass(frozen=True)
class Calibrator:
    """A method and its parameters; ``params`` goes into the calibration cache key."""

    method: str = "max"
    percentile: float = 99.99
    stride: int = 16
    grid: str = "int8"  # the format whose rounding ``mse`` weighs: int8's uniform steps, or FP8 E4M3's
    params: dict[str, Any] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            from quantverdict.errors import CalibrationError

            raise CalibrationError(f"unknown calibration method {self.method!r}; known: {', '.join(METHODS)}")
        relevant = {"percentile": {"percentile": self.percentile}, "entropy": {"stride": self.stride},
                    "mse": {"grid": self.grid} if self.grid != "int8" else {}}
        object.__setattr__(self, "params", {"method": self.method, **relevant.get(self.method, {})})

    @property
    def bins(self) -> int:
        return 0 if self.method == "max" else BINS

    def amax(self, hist: Histogram) -> float:
        if hist.max == 0.0:
            return 0.0
        return float(METHODS[self.method](self, hist))


def _max(cal: Calibrator, hist: Histogram) -> float:
    return hist.max


def _percentile(cal: Calibrator, hist: Histogram) -> float:
    cumulative = np.cumsum(hist.counts) / hist.counts.sum()
    index = int(np.searchsorted(cumulative, cal.percentile / 100.0))
    return min(float(hist.edges[min(index + 1, len(hist.counts))]), hist.max)


def _entropy(cal: Calibrator, hist: Histogram) -> float:
    counts, edges = hist.counts.copy(), hist.edges
    counts[0] = counts[1]  # the spike of exact zeros (ReLU, padding) would dominate the divergence
    total = counts.sum()
    best, best_i = np.inf, len(counts)
    for i in range(QUANT_LEVELS, len(counts) + 1, cal.stride):
        reference = counts[:i].copy()
        reference[-1] += counts[i:].sum()  # outliers clipped into the last bin
        groups = np.arange(i) * QUANT_LEVELS // i
        group_sum = np.bincount(groups, weights=counts[:i], minlength=QUANT_LEVELS)
        group_nonzero = np.bincount(groups, weights=(counts[:i] > 0), minlength=QUANT_LEVELS)
        expanded = np.where(counts[:i] > 0, group_sum[groups] / np.maximum(group_nonzero[groups], 1), 0.0)
        p, q = reference / total, expanded / max(expanded.sum(), 1e-30)
        mask = p > 0
        divergence = np.inf if np.any(q[mask] == 0) else float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if divergence <= best:  # ties go to the larger threshold, as TensorRT's does
            best, best_i = divergence, i
    return min(float(edges[best_i]), hist.max)


def _mse(cal: Calibrator, hist: Histogram) -> float:
    """The threshold with the least expected squared error, clipping plus rounding: on the int8 grid
    rounding costs step²/12 per value; on the E4M3 grid (FP8's scale maps the threshold to 448) it is
    each bin's own rounding error, which grows with the value (3 mantissa bits), so the best FP8
    threshold is not the best INT8 one."""
    centers = (hist.edges[:-1] + hist.edges[1:]) / 2
    candidates = hist.edges[QUANT_LEVELS // 4::cal.stride][1:]
    errors = []
    for amax in candidates:
        clip = np.maximum(centers - amax, 0.0) ** 2
        if cal.grid == "e4m3":
            scale = amax / E4M3_MAX
            rounded = np.minimum(centers / scale, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale
            rounding = np.where(centers <= amax, (rounded - centers) ** 2, 0.0)
        else:
            step = amax / (QUANT_LEVELS - 1)
            rounding = np.where(centers <= amax, step * step / 12.0, 0.0)
        errors.append(float(np.sum(hist.counts * (clip + rounding))))
    return min(float(candidates[int(np.argmin(errors))]), hist.max)


METHODS = {"max": _max, "entropy": _entropy, "percentile": _percentile, "mse": _mse}
