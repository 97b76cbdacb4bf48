"""A run's shared state, put together: the model registry, backends, capabilities, tolerance
table, the :class:`ArtifactStore`, the recipes' :class:`Resolver` over it and the :class:`CaseExecutor`.

The CLI and the pytest plugin both enumerate with :meth:`Pipeline.cases` and run with
:meth:`Pipeline.run`; what each step does lives in ``cases``, ``artifacts`` and ``execute``.
"""
from __future__ import annotations

import copy
import functools
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from quantverdict.backends import Backend, backend_registry
from quantverdict.cache import Cache
from quantverdict.capabilities import Capabilities, detect
from quantverdict.judge.tolerances import ToleranceTable
from quantverdict.models import ModelSpec
from quantverdict.tune.search import Progress
from quantverdict.precision.calibrators import Calibrator
from quantverdict.precision.settings import RecipeSettings
from quantverdict.registry import Registry
from quantverdict.report.gate import case_unjudged, judge_case, load_policy, rules_for, runner_class, runner_class_note
from quantverdict.report.load import load_record
from quantverdict.report.moved import moved
from quantverdict.report.schema import RunRecord
from quantverdict.run.artifacts import ArtifactStore
from quantverdict.run.cases import Case, CaseResult, enumerate_cases
from quantverdict.run.shards import CASE_TIME
from quantverdict.run.execute import CaseExecutor
from quantverdict.tune.folds import search_recipe
from quantverdict.run.manifest import Manifest, default_models, load_manifest, model_registry
from quantverdict.tune.lock import RecipeLock
from quantverdict.tune.resolve import RecipeOptions, Resolver
from quantverdict.tune.result import costed
from quantverdict.run.settings import Settings

__all__ = ["Case", "CaseResult", "Pipeline"]


class Pipeline:
    """``baseline`` (a run record) makes every case also answer to the gate's rules against the
    same case in that record (``policy``: the gate policy file), so a pre-merge run catches what
    the release gate would."""

    def __init__(self, cache_dir: Path, tolerances: Path | None = None, manifest: Path | None = None,
                 capabilities: Capabilities | None = None, calibration: str | None = None, timing: bool = False,
                 baseline: Path | None = None, policy: Path | None = None,
                 recipe_settings: Mapping[str, Mapping[str, Any]] | None = None, lock: Path | None = None,
                 relock: list[str] | None = None, progress: Progress | None = None, check: bool = False):
        self.cache = Cache(cache_dir)
        self.tolerances = ToleranceTable.load(tolerances)
        self.manifest: Manifest | None = load_manifest(manifest) if manifest is not None else None
        self.models: Registry[ModelSpec] = model_registry(self.manifest)
        for name in relock or ():  # a model to search again that no registry holds is a typo, not a no-op
            if name != "all":
                self.models.get(name)
        self.backends: Registry[type[Backend]] = backend_registry()
        self.caps = capabilities or detect()
        self.lock = RecipeLock.read(lock) if lock is not None else None
        options = RecipeOptions(with_calibration(recipe_settings or {}, calibration), self.lock, search_recipe,
                                None if relock and "all" in relock else frozenset(relock or ()), check, progress)
        self.store = ArtifactStore(self.cache, self.models, self.backend, self.tolerances, self.caps)
        self.recipes = Resolver(self.store, options)
        self.executor = CaseExecutor(self.store, self.recipes, self.tolerances, self.backend, self.caps, timing)
        self.baseline = BaselineJudge(load_record(baseline), baseline, load_policy(policy), self.caps.runner_class) \
            if baseline is not None else None

    def on_store(self, store: ArtifactStore) -> "Pipeline":
        """This pipeline over other artifacts (a planted defect's), its recipes resolved anew on them."""
        other = copy.copy(self)
        other.store, other.recipes = store, Resolver(store, self.recipes.options)
        other.executor = CaseExecutor(store, other.recipes, self.tolerances, self.backend, self.caps,
                                      self.executor.timing)
        return other

    @classmethod
    def from_settings(cls, settings: Settings, capabilities: Capabilities | None = None,
                      progress: Progress | None = None) -> "Pipeline":
        return cls(settings["cache-dir"], settings["tolerances"], settings["manifest"], capabilities,
                   settings["calibration"], bool(settings["time"]), settings["baseline"], settings["gate-policy"],
                   settings.recipe_settings(), settings["lock"], settings["relock"], progress)

    def cases(self, models: list[str] | None = None, precisions: list[str] | None = None,
              backends: list[str] | None = None) -> list[Case]:
        """Every model × precision × backend combination the backends offer (validated names); the
        models default to the manifest's own and those it includes, or every registered one without one."""
        model_names = models or default_models(self.manifest, self.models)
        for name in model_names:
            self.models.get(name)
        return enumerate_cases(model_names, backends or self.backends.names(),
                               lambda name: self.backend(name).precisions, precisions)

    @functools.lru_cache(maxsize=None)
    def backend(self, name: str) -> Backend:
        return self.backends.get(name)()

    def skip_reason(self, case: Case) -> str | None:
        """The case's own requirement first (a GPU too old for FP4 says so even where the backend's
        package is missing too), with its recipe as a lock holds it, then the backend's."""
        backend = self.backend(case.backend)
        spec = self.recipes.declared(self.models.get(case.model), case.precision)
        return backend.requirement(spec, case.precision, self.caps) or backend.unavailable(self.caps)

    def run(self, case: Case) -> CaseResult:
        """Run one case (or skip it with the requirement that failed), counting its cache use."""
        reason = self.skip_reason(case)
        if reason:
            return CaseResult(case, "skipped", reason)
        before = Counter(self.cache.stats)
        with costed() as cost:
            result = self.executor.run(case)
            spent = cost()
        result.cost = spent.model_dump()
        result.cache = dict(Counter(self.cache.stats) - before)  # this case's cache hits and misses
        result.timings[CASE_TIME] = spent.wall_s  # what spreads the next run's work
        if self.baseline is not None:
            self.baseline.judge(result)
        return result


def with_calibration(settings: Mapping[str, Mapping[str, Any]],
                     calibration: str | None) -> dict[str, dict[str, Any]]:
    """``--calibration METHOD`` as one more recipe option of the calibrated precisions (INT8, FP8), under those
    that name a precision's calibration themselves; the method checked before anything runs."""
    out = {precision: dict(values) for precision, values in settings.items()}
    if calibration is not None:
        given = RecipeSettings(calibration=Calibrator(calibration).method).to_dict()
        for precision in ("int8", "fp8"):
            out[precision] = {**given, **out.get(precision, {})}
    return out


class BaselineJudge:
    """One case against the same case of a baseline run, under the release gate's rules."""

    def __init__(self, record: RunRecord, path: Path, policy: dict[str, Any], current_class: str):
        self.cases = {case.id: case for case in record.cases}
        self.path, self.policy = path, policy
        self.note = runner_class_note(runner_class(record), current_class)

    def judge(self, result: CaseResult) -> None:
        """Fail ``result`` (keeping its own verdicts' message) on a regression against the baseline."""
        old, new = self.cases.get(result.case.id), result.record()
        problem = case_unjudged(result.case.id, old, new, self.policy.get("allow_unjudged", []))
        if problem:  # skipped here, judged there: not a pass
            result.metrics["baseline"] = {"path": str(self.path), "found": True, "regressions": [problem]}
            result.status, result.message = "failed", f"{problem} (baseline {self.path})"
            return
        if old is None or result.status not in ("passed", "failed"):
            result.metrics["baseline"] = {"path": str(self.path), "found": old is not None}
            return
        regressions, improvements = judge_case(result.case.id, old, new,
                                               rules_for(self.policy, result.case.precision), self.note is None)
        result.metrics["baseline"] = {"path": str(self.path), "found": True, "regressions": regressions,
                                      "improvements": improvements, "note": self.note}
        if regressions:
            result.status = "failed"
            result.metrics["baseline"]["moved"] = moved(old, new)
            lines = [f"{result.case.id}: regressed against baseline {self.path}:", *regressions,
                     f"{result.case.id}: {result.metrics['baseline']['moved']}"]
            if self.note:
                lines.append(f"({self.note})")
            result.message = "\n".join(filter(None, [result.message, *lines]))
