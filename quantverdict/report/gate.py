"""The release gate: a run compared with a baseline run, case by case, under a policy.

Exit codes: 0 clean, 1 at least one regression, 2 bad input. Cases present in only one of
the two runs are always listed, never dropped. The gate never passes what did not run: a case the baseline
judged that is missing from the current run or skipped in it (unless the policy's ``allow_unjudged`` names it),
a case that errored, a passed case that carries no metrics, and a run that judged no case at all are each a
regression; a run with no cases is bad input.

Quantized cases carry two verdicts: the recipe, judged on its graph's semantics (the same on
every CPU), and the runtime's own outputs. Recipe metrics are compared whatever machines the two
runs came from; runtime metrics only between runs of one runner class (CPU instruction-set
class and GPU), because fused integer kernels compute differently on different CPUs. The gate
says so when the classes differ. The same rules judge each case in ``pytest --baseline``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from quantverdict.documents import DocumentError, layers
from quantverdict.precision import known_precisions
from quantverdict.report.load import RecordError
from quantverdict.report.moved import moved
from quantverdict.report.schema import CaseRecord, RunRecord, ViewRecord


class Rules(BaseModel):
    """How much a case may get worse than the baseline's same case (each rule optional)."""

    model_config = ConfigDict(extra="forbid")

    max_accuracy_drop_vs_baseline: float | None = None
    min_fraction_of_fp32_accuracy: float | None = None
    max_cosine_drop_vs_baseline: float | None = None
    max_snr_drop_db: float | None = None
    max_quantized_layers_lost: int | None = None


class GatePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: Rules = Rules()
    precisions: dict[Literal[tuple(known_precisions())], Rules] = {}  # type: ignore[valid-type]
    allow_unjudged: list[str] = []  # case-id patterns that may be missing or skipped where the baseline judged them


@dataclass
class GateResult:
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_current: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # the current run's skipped cases, with their reasons
    notes: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)  # beside each case that regressed: what moved between the runs

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def report(self) -> str:
        sections = [("note", self.notes), ("REGRESSION", self.regressions), ("why", self.moved),
                    ("improved", self.improvements),
                    ("only in baseline", self.only_in_baseline), ("only in current", self.only_in_current),
                    ("skipped", self.skipped)]
        lines = [f"{label}: {item}" for label, items in sections for item in items]
        verdict = f"{len(self.regressions)} regression(s), {len(self.improvements)} improvement(s)"
        return "\n".join([*lines, verdict])


def load_policy(path: Path | None) -> dict[str, Any]:
    """The packaged gate policy with ``path``'s rules merged over it, rule by rule (``null`` removes one)."""
    try:
        documents = layers(path, "gate.yaml", GatePolicy, "gate policy")
    except DocumentError as exc:
        raise RecordError(str(exc)) from None
    policy: dict[str, Any] = {"defaults": {}, "precisions": {}, "allow_unjudged": []}
    for document in documents:
        policy["allow_unjudged"] += document.allow_unjudged
        policy["defaults"].update(document.defaults.model_dump(exclude_unset=True))
        for precision, rules in document.precisions.items():
            policy["precisions"].setdefault(precision, {}).update(rules.model_dump(exclude_unset=True))
    return policy


def rules_for(policy: dict[str, Any], precision: str) -> dict[str, float]:
    merged = {**policy.get("defaults", {}), **policy.get("precisions", {}).get(precision, {})}
    return {rule: limit for rule, limit in merged.items() if limit is not None}


def runner_class(record: RunRecord) -> str:
    return record.environment.runner


def runner_class_note(baseline_class: str, current_class: str) -> str | None:
    if baseline_class == current_class:
        return None
    return (f"baseline ran on runner class {baseline_class!r}, current on {current_class!r}: runtime metrics are "
            "not compared across runner classes; recipe accuracy (the graphs' semantics) is")


def gate(baseline: RunRecord, current: RunRecord, policy: dict[str, Any]) -> GateResult:
    if not current.cases:
        raise RecordError("the current run holds no cases: there is nothing to gate")
    result = GateResult()
    note = runner_class_note(runner_class(baseline), runner_class(current))
    if note:
        result.notes.append(note)
    for label, record in (("baseline", baseline), ("current", current)):
        result.regressions += duplicates(record, label)
    base = {case.id: case for case in baseline.cases}
    cur = {case.id: case for case in current.cases}
    result.only_in_baseline = sorted(set(base) - set(cur))
    result.only_in_current = sorted(set(cur) - set(base))
    for case in current.cases:
        result.regressions += [f"{case.id}: {name} is {value}, not a number: a regression whatever the bounds"
                               for name, value in non_finite(case)]
    result.regressions += unjudged(base, cur, policy.get("allow_unjudged", []))
    result.skipped = [f"{case.id}: {case.reason}" for case in current.cases if case.status == "skipped"]
    for case_id in sorted(set(base) & set(cur)):
        regressions, improvements = judge_case(case_id, base[case_id], cur[case_id],
                                               rules_for(policy, cur[case_id].precision), same_runner=note is None)
        result.regressions += regressions
        result.improvements += improvements
        if regressions:
            why = moved(base[case_id], cur[case_id], baseline.environment, current.environment)
            result.moved.append(f"{case_id}: {why}")
    return result


def case_unjudged(case_id: str, old: CaseRecord | None, new: CaseRecord | None, allowed: list[str]) -> str | None:
    """Why ``new`` (None: missing from the run) leaves unjudged a case the baseline judged (``old``), unless
    ``allowed`` (case-id patterns) names it; None where there is nothing to say."""
    import fnmatch

    if old is None or not old.judged or any(fnmatch.fnmatchcase(case_id, p) for p in allowed):
        return None
    if new is None:
        return f"{case_id}: judged in the baseline ({old.status}), missing from the current run"
    if new.status == "skipped":
        return f"{case_id}: judged in the baseline ({old.status}), skipped now: {new.reason}"
    return None


def unjudged(base: dict[str, CaseRecord], cur: dict[str, CaseRecord], allowed: list[str]) -> list[str]:
    """What the current run did not judge that it should have: a case the baseline judged, missing or skipped now
    (:func:`case_unjudged`), a case that errored, a passed case without metrics, or no case judged at all."""
    found = [problem for case_id, old in sorted(base.items())
             if (problem := case_unjudged(case_id, old, cur.get(case_id), allowed))]
    for case_id, new in sorted(cur.items()):
        old = base.get(case_id)
        if new.status == "error" and (old is None or old.status != "passed"):  # else: judge_case's
            found.append(f"{case_id}: error: {new.message.splitlines()[:1]}")
        elif new.status == "passed" and not new.metrics.metrics:
            found.append(f"{case_id}: passed with no metrics: nothing was judged")
    if cur and not any(case.judged for case in cur.values()):
        found.append(f"the current run judged none of its {len(cur)} case(s): nothing passed the gate")
    return found


def duplicates(record: RunRecord, label: str) -> list[str]:
    """A case id the record holds more than once: which copy counts is undefined, so the run is not clean."""
    statuses: dict[str, list[str]] = {}
    for case in record.cases:
        statuses.setdefault(case.id, []).append(case.status)
    return [f"{case_id}: {len(found)} copies in the {label} run ({', '.join(found)}): a run judges each case once"
            for case_id, found in sorted(statuses.items()) if len(found) > 1]


def non_finite(case: CaseRecord) -> list[tuple[str, float]]:
    """(name, value) of each judged metric of ``case`` that is NaN or infinite (an SNR of +inf, exact
    outputs, excepted)."""
    if not case.judged:
        return []
    metrics, found = case.metrics, []
    views: list[tuple[str, ViewRecord]] = [("", metrics), *((("recipe ", metrics.recipe),) if metrics.recipe else ())]
    for label, view in views:
        for output, values in view.metrics.items():
            for name in ("cosine", "snr_db", "max_norm_err", "top1_agreement"):
                value = getattr(values, name)
                if value is not None and not math.isfinite(value) and not (name == "snr_db" and value > 0):
                    found.append((f"{label}{output} {name}", value))
        for name, value in ((("accuracy", view.task.accuracy), ("reference_accuracy", view.task.reference_accuracy))
                            if view.task else ()):
            if not math.isfinite(value):
                found.append((f"{label}task {name}", value))
    for output in metrics.fidelity.outputs if metrics.fidelity else ():
        if not math.isfinite(output.flip_fraction):
            found.append((f"runtime fidelity flip fraction of {output.output}", output.flip_fraction))
    return found


def judge_case(case_id: str, old: CaseRecord, new: CaseRecord, rules: dict[str, float],
               same_runner: bool) -> tuple[list[str], list[str]]:
    """(regressions, improvements) of one case against its baseline, each a sentence."""
    regressions: list[str] = []
    improvements: list[str] = []
    if old.status == "passed" and new.status in ("failed", "error"):
        regressions.append(f"{case_id}: was passed, now {new.status}: {new.message.splitlines()[:1]}")
    old_recipe, new_recipe = old.metrics.recipe, new.metrics.recipe
    views: list[tuple[ViewRecord, ViewRecord, str]] = []
    if old_recipe and new_recipe:
        views.append((old_recipe, new_recipe, "recipe "))
    if same_runner or not views:
        views.append((old.metrics, new.metrics, ""))
    for old_view, new_view, label in views:
        _compare_view(f"{case_id}: {label}", old_view, new_view, rules, regressions, improvements,
                      old.judged and new.judged)
    old_cover = old_recipe.coverage if old_recipe else None
    new_cover = new_recipe.coverage if new_recipe else None
    if old_cover and new_cover:  # the schema lets a record leave coverage null
        went_float = sorted(set(new_cover.float_layers) & set(old_cover.quantized_layers))
        lost = max(old_cover.quantized - new_cover.quantized, len(went_float))
        limit = rules.get("max_quantized_layers_lost")
        if limit is not None and lost > limit:
            named = f": {', '.join(went_float[:5])}{', …' if len(went_float) > 5 else ''}" if went_float else ""
            regressions.append(f"{case_id}: {new_cover.quantized} of {new_cover.layers} weighted layers "
                               f"quantized, baseline {old_cover.quantized}: {lost} layer(s) quantized in the "
                               f"baseline left in float{named}")
    return regressions, improvements


def uncomparable(name: str, before: float | None, now: float | None) -> str | None:
    """Why a rule on ``name`` cannot compare the baseline's value with the current one (a record whose metrics are all
    null passed the gate with "0 regression(s)"), or None where it can: an SNR of +inf (exact outputs) compares."""
    def usable(value: float | None) -> bool:
        return value is not None and (math.isfinite(value) or (name == "SNR" and value > 0))

    if not usable(before):
        return f"the baseline's {name} is {before}: it cannot be compared (refresh the baseline)"
    if now is None:
        return f"{name} is not recorded now (baseline {before:g}): the rule on it cannot judge the case"
    return None


def _compare_view(prefix: str, old: ViewRecord, new: ViewRecord, rules: dict[str, float],
                  regressions: list[str], improvements: list[str], judged: bool = True) -> None:
    old_task, new_task = old.task, new.task
    if old_task and new_task:
        delta = 100 * (new_task.accuracy - old_task.accuracy)
        limit = rules.get("max_accuracy_drop_vs_baseline")
        text = (f"{prefix}task accuracy {100 * old_task.accuracy:.2f}% → {100 * new_task.accuracy:.2f}% "
                f"({delta:+.2f} points)")
        if limit is not None and -delta > limit:
            regressions.append(f"{text}, limit −{limit:g}")
        elif delta > 0:
            improvements.append(text)
        fraction = rules.get("min_fraction_of_fp32_accuracy")
        if fraction is not None and new_task.reference_accuracy > 0:
            ratio = new_task.accuracy / new_task.reference_accuracy
            if ratio < fraction:
                regressions.append(f"{prefix}{100 * ratio:.2f}% of FP32 accuracy, needs ≥ {100 * fraction:g}%")
    old_m, new_m = old.measured(), new.measured()
    for name, rule, before, now in (("cosine", "max_cosine_drop_vs_baseline", old_m.cosine, new_m.cosine),
                                    ("SNR", "max_snr_drop_db", old_m.snr_db, new_m.snr_db)):
        if judged and rule in rules and (problem := uncomparable(name, before, now)):
            regressions.append(f"{prefix}{problem}")
    if old_m.cosine is not None and new_m.cosine is not None:
        drop, limit = old_m.cosine - new_m.cosine, rules.get("max_cosine_drop_vs_baseline")
        if limit is not None and drop > limit:
            regressions.append(f"{prefix}cosine {old_m.cosine:.6f} → {new_m.cosine:.6f}, limit −{limit:g}")
    if old_m.snr_db is not None and new_m.snr_db is not None and old_m.snr_db != float("inf"):
        drop, limit = old_m.snr_db - new_m.snr_db, rules.get("max_snr_drop_db")
        if limit is not None and not drop <= limit:
            regressions.append(f"{prefix}SNR {old_m.snr_db:.1f} → {new_m.snr_db:.1f} dB, limit −{limit:g} dB")
