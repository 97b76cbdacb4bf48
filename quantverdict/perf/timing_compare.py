"""Two saved benchmark runs compared the way asv does, not one median against one median.

Each benchmark's per-round times (pytest-benchmark saves them with ``--benchmark-save-data``) in
the baseline and the current run are compared with a one-sided Mann-Whitney U test; a benchmark
regressed when its median grew by at least ``ratio`` *and* the test gives p < ``alpha`` (asv's
defaults: 1.1 and 0.002). Neither alone suffices: a large ratio on a handful of noisy rounds is
not evidence, and a significant 1% change is not worth a failure.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantverdict.errors import HarnessError

RATIO = 1.1
ALPHA = 0.002


@dataclass(frozen=True)
class TimingChange:
    name: str
    base_median: float
    current_median: float
    p_value: float
    verdict: str  # "regressed", "improved", "same"

    @property
    def ratio(self) -> float:
        return self.current_median / self.base_median

    def describe(self) -> str:
        return (f"{self.name}: median {1e3 * self.base_median:.3f} → {1e3 * self.current_median:.3f} ms "
                f"(×{self.ratio:.3f}, Mann-Whitney p = {self.p_value:.2g}): {self.verdict}")


def load_rounds(path: Path) -> dict[str, np.ndarray]:
    """Per-round times of every benchmark in a pytest-benchmark JSON file, by full name."""
    try:
        document = json.loads(path.read_text())
        benchmarks = document["benchmarks"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HarnessError(f"{path} is not a pytest-benchmark JSON file: {exc}") from exc
    rounds = {}
    for bench in benchmarks:
        data = bench.get("stats", {}).get("data")
        if not data:
            raise HarnessError(f"{path}: benchmark {bench.get('fullname')!r} has no per-round data; save runs "
                               "with --benchmark-save-data")
        rounds[bench["fullname"]] = np.asarray(data, dtype=np.float64)
    return rounds


def compare_rounds(base: dict[str, np.ndarray], current: dict[str, np.ndarray], ratio: float = RATIO,
                   alpha: float = ALPHA) -> list[TimingChange]:
    from scipy.stats import mannwhitneyu

    changes = []
    for name in sorted(set(base) & set(current)):
        old, new = base[name], current[name]
        slower = mannwhitneyu(new, old, alternative="greater").pvalue
        faster = mannwhitneyu(new, old, alternative="less").pvalue
        old_median, new_median = float(np.median(old)), float(np.median(new))
        verdict = "same"
        if new_median >= ratio * old_median and slower < alpha:
            verdict = "regressed"
        elif old_median >= ratio * new_median and faster < alpha:
            verdict = "improved"
        changes.append(TimingChange(name, old_median, new_median, float(min(slower, faster)), verdict))
    return changes


def compare_files(base: Path, current: Path, ratio: float = RATIO, alpha: float = ALPHA) -> dict[str, Any]:
    """The comparison of two saved runs, with benchmarks present in only one of them listed."""
    old, new = load_rounds(base), load_rounds(current)
    return {"changes": compare_rounds(old, new, ratio, alpha), "only_in_base": sorted(set(old) - set(new)),
            "only_in_current": sorted(set(new) - set(old))}
