"""Running one case: load the backend's runner over the case's artifacts, run the evaluation set,
judge the outputs against the FP32 reference, and turn every failure into data with a message
that names the case."""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict
from typing import Any, Callable

import numpy as np

from harness.backends import Backend
from harness.errors import HarnessError, UnsupportedError
from harness.judge.compare import Comparison, accuracy_check, compare, concat
from harness.judge.diagnose import first_divergence
from harness.judge.tolerances import Tolerance, ToleranceTable
from harness.models import ModelSpec
from harness.perf.bench import time_call
from harness.run.artifacts import ArtifactStore
from harness.run.cases import Case, CaseResult, Status


class CaseExecutor:
    """Runs cases over an :class:`ArtifactStore`; ``timing`` also measures each case's latency."""

    def __init__(self, store: ArtifactStore, tolerances: ToleranceTable, backend: Callable[[str], Backend],
                 timing: bool = False):
        self.store, self.tolerances, self.backend, self.timing = store, tolerances, backend, timing

    def run(self, case: Case) -> CaseResult:
        """Run one case; bad input becomes an ``error`` result whose message names the problem."""
        try:
            return self._run(case)
        except UnsupportedError as exc:
            if self.store.models.get(case.model).declared_unsupported(case.backend, exc.ops):
                return CaseResult(case, "skipped", f"{', '.join(exc.ops)} declared unsupported on {case.backend} "
                                                   f"in the model spec: {exc}")
            return CaseResult(case, "error", f"{case.id}: {exc}")
        except HarnessError as exc:
            return CaseResult(case, "error", f"{case.id}: {exc}")
        except Exception as exc:  # a backend crash is a regression too: keep the trace
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return CaseResult(case, "error", f"{case.id}: {detail}")

    def _run(self, case: Case) -> CaseResult:
        store = self.store
        spec = store.models.get(case.model)
        tolerance = self.tolerances.resolve(case.model, case.precision, spec.tolerances)
        timings: dict[str, float] = {}
        start = time.perf_counter()
        reference = store.reference(case.model)
        timings["reference_s"] = time.perf_counter() - start
        artifacts = store.for_case(case.model, case.precision, case.backend)
        start = time.perf_counter()
        runner = self.backend(case.backend).load(artifacts)
        timings["prepare_s"] = time.perf_counter() - start
        batches = store.eval_batches(case.model)
        with runner:
            start = time.perf_counter()
            candidate = concat([runner.infer(batch) for batch in batches])
            timings["run_s"] = time.perf_counter() - start
            built = runner.describe()
            if self.timing:
                batch = batches[0]
                items = len(next(iter(batch.values())))
                latency = time_call(lambda: runner.infer(batch), items=items).to_dict()
        comparison = compare(reference, candidate, tolerance, spec.task == "classification")
        metrics: dict[str, Any] = comparison.to_dict()
        if built:
            metrics["engine"] = built
        if self.timing:
            metrics["latency"] = latency
        if spec.eval_data is not None:
            _task_accuracy(spec, reference, candidate, tolerance, comparison, metrics)
        status: Status = "passed" if comparison.passed else "failed"
        message = "" if comparison.passed else f"{case.id} vs FP32 reference:\n{comparison.explain()}"
        if not comparison.passed and case.backend == "onnxruntime" and spec.build is not None:
            divergence = first_divergence(store.fp32_onnx(case.model), artifacts.onnx_path(),
                                          batches[0], tolerance.min_cosine or 0.999)
            if divergence:
                metrics["first_divergence"] = divergence
                message += (f"\nfirst diverging layer: {divergence['node']} ({divergence['op']}) output "
                            f"{divergence['tensor']!r}, cosine {divergence['cosine']:.6f} < {divergence['bound']:g}")
        return CaseResult(case, status, message, metrics, tolerance.to_dict(), timings)


def _task_accuracy(spec: ModelSpec, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                   tolerance: Tolerance, comparison: Comparison, metrics: dict[str, Any]) -> None:
    labels = spec.eval_data().labels  # type: ignore[misc]
    output = spec.outputs[0]
    ref_acc = float(np.mean(reference[output].argmax(-1) == labels))
    cand_acc = float(np.mean(candidate[output].argmax(-1) == labels))
    metrics["task"] = {"reference_accuracy": ref_acc, "accuracy": cand_acc,
                       "accuracy_drop_points": 100.0 * (ref_acc - cand_acc)}
    check = accuracy_check(ref_acc, cand_acc, tolerance)
    if check is not None:
        comparison.checks.append(check)
        metrics["checks"] = [*metrics["checks"], {**asdict(check), "passed": check.passed}]
