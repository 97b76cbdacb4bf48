"""The release gate: a run compared with a baseline run, case by case, under a policy.

Exit codes: 0 clean, 1 at least one regression, 2 bad input. Cases present in only one of
the two runs are always listed, never dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.report.load import RecordError, primary_metrics

DEFAULT_POLICY = Path(__file__).resolve().parents[2] / "fixtures" / "gate.yaml"
_RULES = {"max_accuracy_drop_vs_baseline", "min_fraction_of_fp32_accuracy", "max_cosine_drop_vs_baseline",
          "max_snr_drop_db"}


@dataclass
class GateResult:
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_current: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def report(self) -> str:
        sections = [("REGRESSION", self.regressions), ("improved", self.improvements),
                    ("only in baseline", self.only_in_baseline), ("only in current", self.only_in_current)]
        lines = [f"{label}: {item}" for label, items in sections for item in items]
        verdict = f"{len(self.regressions)} regression(s), {len(self.improvements)} improvement(s)"
        return "\n".join([*lines, verdict])


def load_policy(path: Path | None) -> dict[str, Any]:
    path = path or DEFAULT_POLICY
    try:
        policy = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise RecordError(f"cannot read gate policy {path}: {exc}") from exc
    for section, rules in [("defaults", policy.get("defaults", {})), *policy.get("precisions", {}).items()]:
        unknown = set(rules or {}) - _RULES
        if unknown:
            raise RecordError(f"{path}: {section}: unknown rule(s) {sorted(unknown)}; allowed: {sorted(_RULES)}")
    return policy


def _rules(policy: dict[str, Any], precision: str) -> dict[str, float]:
    return {**policy.get("defaults", {}), **policy.get("precisions", {}).get(precision, {})}


def gate(baseline: dict[str, Any], current: dict[str, Any], policy: dict[str, Any]) -> GateResult:
    result = GateResult()
    base = {case["id"]: case for case in baseline["cases"]}
    cur = {case["id"]: case for case in current["cases"]}
    result.only_in_baseline = sorted(set(base) - set(cur))
    result.only_in_current = sorted(set(cur) - set(base))
    for case_id in sorted(set(base) & set(cur)):
        _compare_case(case_id, base[case_id], cur[case_id], _rules(policy, cur[case_id]["precision"]), cur, result)
    return result


def _compare_case(case_id: str, old: dict[str, Any], new: dict[str, Any], rules: dict[str, float],
                  current: dict[str, dict[str, Any]], result: GateResult) -> None:
    if old["status"] == "passed" and new["status"] in ("failed", "error"):
        result.regressions.append(f"{case_id}: was passed, now {new['status']}: {new.get('message', '').splitlines()[:1]}")
    old_task, new_task = old.get("metrics", {}).get("task"), new.get("metrics", {}).get("task")
    if old_task and new_task:
        delta = 100 * (new_task["accuracy"] - old_task["accuracy"])
        limit = rules.get("max_accuracy_drop_vs_baseline")
        text = f"{case_id}: task accuracy {100 * old_task['accuracy']:.2f}% → {100 * new_task['accuracy']:.2f}% ({delta:+.2f} points)"
        if limit is not None and -delta > limit:
            result.regressions.append(f"{text}, limit −{limit:g}")
        elif delta > 0:
            result.improvements.append(text)
        fraction = rules.get("min_fraction_of_fp32_accuracy")
        if fraction is not None and new_task["reference_accuracy"] > 0:
            ratio = new_task["accuracy"] / new_task["reference_accuracy"]
            if ratio < fraction:
                result.regressions.append(f"{case_id}: {100 * ratio:.2f}% of FP32 accuracy, needs ≥ {100 * fraction:g}%")
    old_m, new_m = primary_metrics(old), primary_metrics(new)
    if "cosine" in old_m and "cosine" in new_m:
        drop, limit = old_m["cosine"] - new_m["cosine"], rules.get("max_cosine_drop_vs_baseline")
        if limit is not None and drop > limit:
            result.regressions.append(f"{case_id}: cosine {old_m['cosine']:.6f} → {new_m['cosine']:.6f}, limit −{limit:g}")
    if "snr_db" in old_m and "snr_db" in new_m and old_m["snr_db"] != float("inf"):
        drop, limit = old_m["snr_db"] - new_m["snr_db"], rules.get("max_snr_drop_db")
        if limit is not None and drop > limit:
            result.regressions.append(f"{case_id}: SNR {old_m['snr_db']:.1f} → {new_m['snr_db']:.1f} dB, limit −{limit:g} dB")
