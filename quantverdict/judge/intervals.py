"""Uncertainty of metrics measured over evaluation samples, and the resolution of a bound.

- Proportions (top-1 agreement, task accuracy): exact Clopper–Pearson intervals.
- A paired accuracy drop (reference and candidate judged on the same samples) and cosine and
  SNR: percentile bootstraps over samples (seeded, so reproducible); cosine and SNR from
  per-sample sums, so a resample costs a few vector operations.
- Resolution: on ``n`` samples one sample moves a proportion by 1/n. A bound that allows less
  than that (but more than nothing) cannot be resolved: it is widened to one sample, and the
  warning names the sample count that would resolve it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict[str, float]:
        return {"low": self.low, "high": self.high, "confidence": self.confidence}


def proportion_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Exact (Clopper–Pearson) interval for a proportion ``successes / n``."""
    from scipy.special import betaincinv  # the beta distribution's quantile, without scipy.stats' imports

    if n <= 0:
        return Interval(0.0, 1.0, confidence)
    alpha = 1.0 - confidence
    low = 0.0 if successes == 0 else float(betaincinv(successes, n - successes + 1, alpha / 2))
    high = 1.0 if successes == n else float(betaincinv(successes + 1, n - successes, 1 - alpha / 2))
    return Interval(low, high, confidence)


def accuracy_drop_interval(reference_correct: np.ndarray, candidate_correct: np.ndarray,
                           confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES) -> Interval:
    """Interval of the paired accuracy drop, in percentage points (positive = candidate worse).

    A percentile bootstrap over samples of (b − c) / n; with no discordant sample at all, the
    exact upper bound δ of the discordance rate gives [−δ, δ] instead of a false [0, 0].
    """
    ref, cand = np.asarray(reference_correct, bool), np.asarray(candidate_correct, bool)
    n = ref.size
    per_sample = ref.astype(np.int8) - cand.astype(np.int8)  # +1 lost, −1 gained, 0 same
    if not per_sample.any():
        rate = proportion_interval(0, n, confidence).high
        return Interval(-100.0 * rate, 100.0 * rate, confidence)
    picks = np.random.default_rng(BOOTSTRAP_SEED).integers(0, n, size=(resamples, n))
    drops = 100.0 * per_sample[picks].mean(1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(drops, [tail, 100 - tail])
    return Interval(float(low), float(high), confidence)


def bootstrap_cosine_snr(reference: np.ndarray, candidate: np.ndarray, confidence: float = CONFIDENCE,
                         resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Interval] | None:
    """Bootstrap intervals of cosine and SNR (dB) over samples (axis 0); None for fewer than 2, and where the candidate
    is not finite where the reference is (its cosine is NaN: the resamples that miss the sample would read as 1)."""
    n = reference.shape[0] if reference.ndim else 0
    if n < 2:
        return None
    r = reference.reshape(n, -1).astype(np.float64)
    c = candidate.reshape(n, -1).astype(np.float64)
    if not np.isfinite(c[np.isfinite(r)]).all():
        return None
    dot, rr, cc, noise = (r * c).sum(1), (r * r).sum(1), (c * c).sum(1), ((c - r) ** 2).sum(1)
    picks = np.random.default_rng(BOOTSTRAP_SEED).integers(0, n, size=(resamples, n))
    sums = {name: values[picks].sum(1) for name, values in (("dot", dot), ("rr", rr), ("cc", cc), ("noise", noise))}
    with np.errstate(divide="ignore", invalid="ignore"):
        cosine = np.clip(sums["dot"] / np.sqrt(sums["rr"] * sums["cc"]), -1.0, 1.0)
        snr = 10 * np.log10(sums["rr"] / sums["noise"])
    tail = 100 * (1 - confidence) / 2
    out = {}
    for name, values in (("cosine", cosine), ("snr_db", snr)):
        finite = values[np.isfinite(values)] if name == "cosine" else np.nan_to_num(values, nan=np.inf)
        if finite.size:
            with np.errstate(invalid="ignore"):  # infinite SNR (an exact resample) is a valid end
                low, high = np.percentile(finite, [tail, 100 - tail])
            out[name] = Interval(float(low), float(high), confidence)
    return out


@dataclass(frozen=True)
class Resolution:
    """The bound used, and why it differs from the one given (empty when it does not)."""

    used: float
    warning: str = ""


def resolve_drop_bound(bound_points: float, n: int, what: str) -> Resolution:
    """A maximum accuracy drop (points) on ``n`` samples: at least one sample's worth, unless 0."""
    quantum = 100.0 / n
    if bound_points <= 0 or bound_points >= quantum:
        return Resolution(bound_points)
    needed = math.ceil(100.0 / bound_points)
    return Resolution(quantum,
                      f"{what}: a {bound_points:g}-point bound is finer than {n} samples resolve (one sample = "
                      f"{quantum:.3g} points): widened to {quantum:.3g}; {needed} samples would resolve it")


def resolve_agreement_bound(bound: float, n: int, what: str) -> Resolution:
    """A minimum agreement fraction on ``n`` samples: it allows at least one sample, unless exactly 1."""
    allowance = 1.0 - bound
    if allowance <= 0 or allowance >= 1.0 / n - 1e-12:
        return Resolution(bound)
    needed = math.ceil(1.0 / allowance - 1e-9)
    used = 1.0 - 1.0 / n
    return Resolution(used,
                      f"{what}: a bound of {bound:g} is finer than {n} samples resolve (one sample = {1 / n:.3g}): "
                      f"widened to {used:.4g}; {needed} samples would resolve it")


def samples_to_resolve(min_top1: float | None, max_accuracy_drop: float | None) -> int:
    """The fewest samples on which both bounds allow at least one sample's change (1 if none bind)."""
    needed = 1
    if min_top1 is not None and 0 < 1.0 - min_top1:
        needed = max(needed, math.ceil(1.0 / (1.0 - min_top1) - 1e-9))
    if max_accuracy_drop is not None and max_accuracy_drop > 0:
        needed = max(needed, math.ceil(100.0 / max_accuracy_drop - 1e-9))
    return needed
