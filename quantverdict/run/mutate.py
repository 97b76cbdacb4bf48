"""Detection power: plant each defect of the catalogue into each model, run the case as the suite
does, and count which checks catch it; rerun the clean cases to count false alarms.

Checks counted for each planted defect:
- ``tolerance``: the case fails its absolute bounds (recipe on the graph's semantics, the
  runtime's outputs, runtime fidelity): what ``pytest -m int8`` says with no baseline;
- ``baseline``: the gate's rules against the clean run (``pytest --baseline``, ``quantverdict gate``);
- ``any``: either.
A defect is *significant* when it costs ≥ ``MIN_SNR_COST_DB`` of SNR on the graph's semantics, or
≥ ``MIN_ACCURACY_COST`` points of task accuracy, or makes outputs non-finite; detection power is
the fraction of significant defects caught.
"""
from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from quantverdict.cache import Cache
from quantverdict.hashing import content_hash, source_fingerprint
from quantverdict.judge.mutations import NO_SITE, Mutation
from quantverdict.models.spec import Batch
from quantverdict.report.gate import judge_case, load_policy, rules_for
from quantverdict.report.schema import CaseRecord
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline
from quantverdict.run.views import Planter

MIN_SNR_COST_DB = 6.0
MIN_ACCURACY_COST = 1.0


class MutationPlanter(Planter):
    """``mutation`` planted at its stage: the FP32 graph, the precision graph (of the precisions it names) or the
    calibration batches; each mutant graph cached by the graph it was made from and the mutation."""

    def __init__(self, mutation: Mutation, cache: Cache):
        self.mutation, self.cache = mutation, cache

    def graph(self, stage: str, path: Path, precision: str | None = None) -> Path:
        mutation = self.mutation
        if mutation.stage != stage or (precision and precision not in mutation.precisions):
            return path
        import onnx

        from quantverdict.export.compat import serialized

        source = path.read_bytes()
        key = content_hash("mutant", source, mutation.key(), source_fingerprint("quantverdict.judge.mutations"))
        return self.cache.get_or_create("mutant", key, ".onnx",
                                        lambda: serialized(mutation.graph(onnx.load_from_string(source))),
                                        {"mutation": mutation.name})

    def batches(self, batches: list[Batch]) -> list[Batch]:
        return self.mutation.batches(batches) if self.mutation.stage == "calibration" else batches

    def key(self) -> Any:
        return [self.mutation.key(), self.mutation.precisions]


def mutated(pipeline: Pipeline, mutation: Mutation) -> Pipeline:
    """``pipeline`` with ``mutation`` planted in its artifacts (everything else shared)."""
    return pipeline.on_store(pipeline.store.planted_with(MutationPlanter(mutation, pipeline.cache)))


@dataclass
class Planted:
    model: str
    precision: str
    defect: str
    kind: str
    snr_cost_db: float
    accuracy_cost: float | None
    caught_by: list[str]
    status: str
    detail: str = ""

    @property
    def significant(self) -> bool:
        return not math.isfinite(self.snr_cost_db) or self.snr_cost_db >= MIN_SNR_COST_DB or \
            (self.accuracy_cost is not None and self.accuracy_cost >= MIN_ACCURACY_COST)


@dataclass
class Campaign:
    planted: list[Planted] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)
    clean_reruns: int = 0
    false_alarms: list[str] = field(default_factory=list)

    def table(self) -> list[dict[str, Any]]:
        """Per defect kind: planted, significant, and the fraction of significant ones each check caught."""
        rows: dict[str, list[Planted]] = defaultdict(list)
        for item in self.planted:
            rows[item.kind].append(item)
        out = []
        for kind, items in sorted(rows.items()):
            significant = [i for i in items if i.significant]
            row = {"kind": kind, "planted": len(items), "significant": len(significant)}
            for check in ("tolerance", "baseline", "any"):
                caught = [i for i in significant if check in i.caught_by]
                row[check] = len(caught) / len(significant) if significant else None
                row[f"{check}_all"] = sum(check in i.caught_by for i in items) / len(items)
            out.append(row)
        return out

    def power(self, check: str = "any") -> float | None:
        significant = [i for i in self.planted if i.significant]
        return sum(check in i.caught_by for i in significant) / len(significant) if significant else None

    def to_dict(self) -> dict[str, Any]:
        return {"planted": [{**asdict(p), "significant": p.significant} for p in self.planted],
                "not_applicable": self.not_applicable, "table": self.table(), "power": self.power(),
                "power_tolerance_only": self.power("tolerance"), "clean_reruns": self.clean_reruns,
                "false_alarms": self.false_alarms}


def run_campaign(pipeline: Pipeline, models: list[str], mutations: list[Mutation], reruns: int = 0,
                 backend: str = "onnxruntime", policy: Path | None = None,
                 fresh_pipeline: Callable[[Path], Pipeline] | None = None) -> Campaign:
    """Plant every mutation into every model; ``reruns`` clean reruns, each from a cold cache made by
    ``fresh_pipeline(cache_dir)`` (default: built-ins and ``pipeline``'s tolerances only)."""
    gate_policy = load_policy(policy)
    precisions = sorted({p for m in mutations for p in m.precisions})
    clean = {case.id: pipeline.run(case).record() for model in models for case in
             [Case(model, p, backend) for p in precisions]}
    campaign = Campaign()
    for mutation in mutations:
        mutant = mutated(pipeline, mutation)
        for model in models:
            for precision in mutation.precisions:
                case = Case(model, precision, backend)
                result = mutant.run(case)
                if result.status == "error" and NO_SITE in result.message:
                    campaign.not_applicable.append(f"{mutation.name} on {case.id}")
                    continue
                campaign.planted.append(_judge(case, mutation, clean[case.id], result.record(), gate_policy))
    for _ in range(reruns):
        with tempfile.TemporaryDirectory(prefix="quantverdict-rerun-") as cold:  # a cold cache: export, calibrate again
            fresh = (fresh_pipeline or (lambda cache: Pipeline(cache, capabilities=pipeline.caps)))(Path(cold))
            for case_id, old in clean.items():
                new = fresh.run(Case(old.model, old.precision, old.backend)).record()
                regressions, _ = judge_case(case_id, old, new, rules_for(gate_policy, old.precision), True)
                if new.status != old.status or regressions:
                    campaign.false_alarms.append(f"{case_id}: {new.status}; {'; '.join(regressions)}")
        campaign.clean_reruns += 1
    return campaign


def _judge(case: Case, mutation: Mutation, old: CaseRecord, new: CaseRecord, policy: dict[str, Any]) -> Planted:
    regressions, _ = judge_case(case.id, old, new, rules_for(policy, case.precision), same_runner=True)
    caught = []
    if new.status in ("failed", "error"):
        caught.append("tolerance")
    if regressions:
        caught.append("baseline")
    if caught:
        caught.append("any")
    snr_cost, accuracy_cost = _costs(old, new)
    detail = (new.message or "; ".join(regressions)).splitlines()[0] if caught else ""
    return Planted(case.model, case.precision, mutation.name, mutation.kind, snr_cost, accuracy_cost, caught,
                   new.status, detail)


def _costs(old: CaseRecord, new: CaseRecord) -> tuple[float, float | None]:
    """SNR lost (dB) and task accuracy lost (points), on the graph's semantics where there is one."""
    old_view, new_view = old.metrics.recipe or old.metrics, new.metrics.recipe or new.metrics
    old_m, new_m = old_view.measured(), new_view.measured()
    new_snr = math.nan if new_m.snr_db is None else new_m.snr_db
    lost = old_m.snr_db is None or math.isnan(new_snr) or new_snr == -math.inf or (new_m.nonfinite or 0) > 0
    snr_cost = math.inf if lost else old_m.snr_db - new_snr  # lost: gone, misshapen or non-finite output
    old_task, new_task = old_view.task, new_view.task
    accuracy_cost = 100 * (old_task.accuracy - new_task.accuracy) if old_task and new_task else None
    return snr_cost, accuracy_cost
