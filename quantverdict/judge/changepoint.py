"""A metric's history judged as a series, not as one pair of runs.

- Steps: binary segmentation. The best split of a segment maximises the two-sample t (pooled
  variance) between its two sides, computed for every split at once from cumulative sums; it is
  kept when a permutation
  test of that maximum (the order of the values shuffled, so searching over splits is paid for)
  gives p < ``alpha`` and the change is at least ``min_change`` (Apache Otava: E-divisive means
  kept at p < 0.001; asv: steps below max(noise, 5%) dropped). Segments are split again until no
  kept step remains.
- The series' state, from its last ``window`` runs: the last kept step with ≥ ``confirm`` runs
  after it is a *regression* or an *improvement* (PyTorch HUD: ≥ 2 consecutive violations);
  failing that, the last run alone beyond ``outlier_z`` robust deviations of the runs before it
  and ``min_change`` is *suspicious* (one run, not yet a trend); fewer than ``min_points`` runs
  is *insufficient data*; anything else *stable*.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict

PERMUTATIONS = 999
SEED = 0


class Policy(BaseModel):
    """Thresholds for judging one kind of metric series; also the schema of a history policy's entries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = 60
    min_points: int = 5
    alpha: float = 0.01  # family-wise: the permutation test pays for the search over splits
    min_change: float = 0.05  # relative (fraction of the level) or absolute, per ``relative``
    relative: bool = True
    min_segment: int = 2
    confirm: int = 2
    outlier_z: float = 4.0

    def change(self, before: float, after: float) -> float:
        """The size of a change in this policy's units (relative to ``before``, or absolute)."""
        return abs(after - before) / abs(before) if self.relative and before else abs(after - before)


@dataclass(frozen=True)
class Step:
    index: int  # position of the first run after the change
    before: float
    after: float
    p_value: float


@dataclass(frozen=True)
class Verdict:
    state: str  # stable | suspicious | regression | improvement | insufficient data
    steps: tuple[Step, ...]
    detail: str = ""


def _split_t(values: np.ndarray, min_segment: int) -> np.ndarray:
    """|t| of the two-sample test with pooled variance for every split k (left = values[:k]); NaN where
    a side is shorter than ``min_segment``. Pooled, not Welch: a two-run side's own variance is too
    noisy, and the search over splits would chase it."""
    n = values.shape[-1]
    k = np.arange(1, n)
    s1 = np.cumsum(values, axis=-1)[..., :-1]
    s2 = np.cumsum(values ** 2, axis=-1)[..., :-1]
    total, total2 = values.sum(-1, keepdims=True), (values ** 2).sum(-1, keepdims=True)
    m1, m2 = s1 / k, (total - s1) / (n - k)
    within = np.maximum((s2 - k * m1 ** 2) + ((total2 - s2) - (n - k) * m2 ** 2), 0) / max(n - 2, 1)
    spread = np.sqrt(within * (1 / k + 1 / (n - k)))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(m1 - m2) / spread
    t = np.where(spread > 0, t, np.where(m1 != m2, np.inf, 0.0))
    valid = (k >= min_segment) & (n - k >= min_segment)
    return np.where(valid, t, np.nan)


def _best_split(values: np.ndarray, policy: Policy, rng: np.random.Generator) -> Step | None:
    n = values.size
    if n < 2 * policy.min_segment:
        return None
    t = _split_t(values, policy.min_segment)
    if np.all(np.isnan(t)):
        return None
    k = int(np.nanargmax(t)) + 1
    before, after = float(values[:k].mean()), float(values[k:].mean())
    if policy.change(before, after) < policy.min_change:
        return None
    shuffled = np.array([rng.permutation(values) for _ in range(PERMUTATIONS)])
    null = np.nanmax(_split_t(shuffled, policy.min_segment), axis=-1)
    p_value = (1 + int(np.sum(null >= t[k - 1]))) / (PERMUTATIONS + 1)
    return Step(k, before, after, p_value) if p_value < policy.alpha or not np.isfinite(t[k - 1]) else None


def find_steps(values: np.ndarray, policy: Policy) -> list[Step]:
    """Kept steps of ``values``, in order, by binary segmentation."""
    rng = np.random.default_rng(SEED)
    steps, pending = [], [(0, np.asarray(values, np.float64))]
    while pending:
        offset, segment = pending.pop()
        step = _best_split(segment, policy, rng)
        if step is None:
            continue
        steps.append(Step(offset + step.index, step.before, step.after, step.p_value))
        pending += [(offset, segment[:step.index]), (offset + step.index, segment[step.index:])]
    return sorted(steps, key=lambda s: s.index)


def worse(before: float, after: float, higher_is_better: bool) -> bool:
    """Whether moving from ``before`` to ``after`` is a change for the worse."""
    return after < before if higher_is_better else after > before


def classify(values: np.ndarray, policy: Policy, higher_is_better: bool) -> Verdict:
    """The state of a series (oldest first) under ``policy``."""
    series = np.asarray(values, np.float64)[-policy.window:]
    series = series[np.isfinite(series)]
    if series.size < policy.min_points:
        return Verdict("insufficient data", (), f"{series.size} run(s), needs {policy.min_points}")
    steps = tuple(find_steps(series, policy))
    confirmed = [s for s in steps if series.size - s.index >= policy.confirm]
    if confirmed:
        last = confirmed[-1]
        state = "regression" if worse(last.before, last.after, higher_is_better) else "improvement"
        return Verdict(state, steps, f"step at run {last.index + 1} of {series.size}: {last.before:.6g} → "
                                     f"{last.after:.6g} (p = {last.p_value:.2g})")
    history, latest = series[:-1], series[-1]
    if history.size >= policy.min_points - 1:
        center = float(np.median(history))
        spread = 1.4826 * float(np.median(np.abs(history - center)))
        beyond = abs(latest - center) > policy.outlier_z * spread if spread > 0 else latest != center
        if beyond and policy.change(center, latest) >= policy.min_change and worse(center, latest, higher_is_better):
            return Verdict("suspicious", steps, f"last run {latest:.6g} against {center:.6g} (one run)")
    return Verdict("stable", steps)
