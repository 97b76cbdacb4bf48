"""One case = model × precision × backend, run through export → recipe → backend → compare.

:class:`Pipeline` holds what cases share (cache, tolerance table, capabilities, built models
and reference outputs) so that a session running hundreds of cases builds each model and
computes each reference once. The CLI and the pytest plugin both call :meth:`Pipeline.run`.
"""
from __future__ import annotations

import functools
import time
from collections import Counter
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from harness.backends import Artifacts, Backend, backend_registry
from harness.bench import time_call
from harness.cache import Cache, content_hash, source_fingerprint
from harness.capabilities import Capabilities, detect
from harness.compare import Comparison, accuracy_check, compare, concat
from harness.diagnose import first_divergence
from harness.errors import CalibrationError, HarnessError, UnsupportedError
from harness.export import export_onnx, load_onnx
from harness.models import ModelSpec, model_registry
from harness.models.spec import Batch
from harness.precision import Recipe, get_recipe
from harness.precision.calibrate import calibrate
from harness.precision.calibrators import Calibrator
from harness.registry import Registry
from harness.tolerances import ToleranceTable

EVAL_BATCHES = 4
CALIBRATION_BATCHES = 4
EVAL_SEED, CALIBRATION_SEED = 1, 2

Status = Literal["passed", "failed", "skipped", "error"]


@dataclass(frozen=True)
class Case:
    model: str
    precision: str
    backend: str

    @property
    def id(self) -> str:
        return f"{self.model}-{self.precision}-{self.backend}"


@dataclass
class CaseResult:
    """The outcome of one case, as data (serialised into the run record)."""

    case: Case
    status: Status
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    tolerance: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.case), "id": self.case.id, "status": self.status, "message": self.message,
                "metrics": self.metrics, "tolerance": self.tolerance, "timings": self.timings, "cache": self.cache}


class Pipeline:
    def __init__(self, cache_dir: Path, tolerances: Path | None = None, manifest: Path | None = None,
                 capabilities: Capabilities | None = None, calibration: str | None = None, timing: bool = False):
        self.cache = Cache(cache_dir)
        self.tolerances = ToleranceTable.load(tolerances)
        self.models: Registry[ModelSpec] = model_registry(manifest)
        self.backends: Registry[type[Backend]] = backend_registry()
        self.caps = capabilities or detect()
        self.calibrator = Calibrator(calibration) if calibration else None
        self.timing = timing  # also measure each case's latency on its first eval batch (harness.bench)

    # -- enumeration -------------------------------------------------------------------------
    def cases(self, models: list[str] | None = None, precisions: list[str] | None = None,
              backends: list[str] | None = None) -> list[Case]:
        """Every model × precision × backend combination the backends offer (validated names)."""
        model_names = models or self.models.names()
        for name in model_names:
            self.models.get(name)
        for name in precisions or []:
            get_recipe(name)
        out = []
        for backend_name in backends or self.backends.names():
            offered = self.backend(backend_name).precisions
            for model in model_names:
                for precision in precisions or sorted(offered, key=_precision_order):
                    if precision in offered:
                        out.append(Case(model, precision, backend_name))
        return out

    @functools.lru_cache(maxsize=None)
    def backend(self, name: str) -> Backend:
        return self.backends.get(name)()

    def skip_reason(self, case: Case) -> str | None:
        """The case's own requirement first (a GPU too old for FP4 says so even where the backend's
        package is missing too), then the backend's."""
        backend = self.backend(case.backend)
        return backend.requirement(self.models.get(case.model), case.precision, self.caps) or \
            backend.unavailable(self.caps)

    # -- artifacts (each memoised per process, cached on disk by content hash) ---------------
    @functools.lru_cache(maxsize=4)
    def module(self, model: str) -> Any:
        """The torch module, built under the spec's seed so every build has the same weights."""
        import torch

        spec = self.models.get(model)
        assert spec.build is not None
        torch.manual_seed(spec.seed)
        return spec.build().eval()

    @functools.lru_cache(maxsize=None)
    def fp32_onnx(self, model: str) -> Path:
        spec = self.models.get(model)
        if spec.onnx_path is not None:
            load_onnx(spec.onnx_path)
            return spec.onnx_path
        return export_onnx(spec, self.module(model), self.cache)

    def ranges(self, model: str, recipe: Recipe) -> dict[str, float]:
        """Calibrated activation ranges for ``recipe`` (empty for uncalibrated recipes); cached."""
        return self._fp32_and_ranges(model, recipe)[2]

    def _fp32_and_ranges(self, model: str, recipe: Recipe) -> tuple[bytes, Any, dict[str, float]]:
        """The FP32 graph's bytes, the graph parsed once, and the recipe's calibrated ranges."""
        import onnx

        source_bytes = self.fp32_onnx(model).read_bytes()
        graph = onnx.load_from_string(source_bytes)
        if not recipe.calibrated:
            return source_bytes, graph, {}
        ranges = calibrate(self.cache, source_bytes, recipe.tensors_to_calibrate(graph),
                           self.calibration_batches(model), recipe.calibrator)
        return source_bytes, graph, ranges

    def precision_onnx(self, model: str, recipe: Recipe) -> Path:
        """The FP32 graph transformed by ``recipe`` (calibrated first if it needs ranges)."""
        source_bytes, graph, ranges = self._fp32_and_ranges(model, recipe)
        key = content_hash("precision", source_bytes, recipe.params(), ranges, source_fingerprint("harness.precision"))
        return self.cache.get_or_create("precision", key, ".onnx",
                                        lambda: recipe.apply(graph, ranges).SerializeToString(),
                                        {"model": model, **recipe.params()})

    def calibration_batches(self, model: str) -> list[Batch]:
        spec = self.models.get(model)
        if spec.calibration is None:
            raise CalibrationError(
                f"model {model!r} has no calibration set: give it one in the manifest "
                "(calibration: module:callable) or set calibration: synthetic to calibrate on generated inputs")
        if spec.calibration == "synthetic":
            return spec.sample_batches(CALIBRATION_BATCHES, CALIBRATION_SEED)
        batches = spec.calibration()  # type: ignore[operator]
        if not batches:
            raise CalibrationError(f"model {model!r}: its calibration callable returned no batches")
        return batches

    def eval_batches(self, model: str) -> list[Batch]:
        spec = self.models.get(model)
        if spec.eval_data is not None:
            return spec.eval_data().inputs
        return spec.sample_batches(EVAL_BATCHES, EVAL_SEED)

    @functools.lru_cache(maxsize=4)
    def reference(self, model: str) -> dict[str, np.ndarray]:
        """FP32 reference outputs: the torch module (on CUDA when present, TF32 off), or ONNX Runtime
        for an ONNX-only model."""
        backend = "torch" if self.models.get(model).build is not None else "onnxruntime"
        with self.backend(backend).load(self.artifacts(model, "fp32", backend)) as runner:
            return concat([runner.infer(batch) for batch in self.eval_batches(model)])

    def artifacts(self, model: str, precision: str, backend: str) -> Artifacts:
        """Lazy handles on what ``backend`` needs for ``model`` in ``precision``."""
        spec = self.models.get(model)
        recipe = get_recipe(precision).for_target(self.backend(backend).recipe_target)
        if self.calibrator is not None and recipe.calibrated:
            recipe = recipe.with_options(calibrator=self.calibrator)  # type: ignore[attr-defined]
        module = None if spec.build is None else functools.partial(self.module, model)
        return Artifacts(spec, recipe, module, onnx_path=lambda: self.precision_onnx(model, recipe),
                         fp32_onnx=lambda: self.fp32_onnx(model), ranges=lambda: self.ranges(model, recipe),
                         calibration_batches=lambda: self.calibration_batches(model), cache=self.cache)

    # -- running -----------------------------------------------------------------------------
    def run(self, case: Case) -> CaseResult:
        """Run one case; bad input becomes an ``error`` result whose message names the problem."""
        reason = self.skip_reason(case)
        if reason:
            return CaseResult(case, "skipped", reason)
        before = Counter(self.cache.stats)
        result = self._guarded_run(case)
        result.cache = dict(Counter(self.cache.stats) - before)  # this case's cache hits and misses
        return result

    def _guarded_run(self, case: Case) -> CaseResult:
        try:
            return self._run(case)
        except UnsupportedError as exc:
            if self.models.get(case.model).declared_unsupported(case.backend, exc.ops):
                return CaseResult(case, "skipped", f"{', '.join(exc.ops)} declared unsupported on {case.backend} "
                                                   f"in the model spec: {exc}")
            return CaseResult(case, "error", f"{case.id}: {exc}")
        except HarnessError as exc:
            return CaseResult(case, "error", f"{case.id}: {exc}")
        except Exception as exc:  # a backend crash is a regression too: keep the trace
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return CaseResult(case, "error", f"{case.id}: {detail}")

    def _run(self, case: Case) -> CaseResult:
        spec = self.models.get(case.model)
        tolerance = self.tolerances.resolve(case.model, case.precision, spec.tolerances)
        timings: dict[str, float] = {}
        start = time.perf_counter()
        reference = self.reference(case.model)
        timings["reference_s"] = time.perf_counter() - start
        artifacts = self.artifacts(case.model, case.precision, case.backend)
        start = time.perf_counter()
        runner = self.backend(case.backend).load(artifacts)
        timings["prepare_s"] = time.perf_counter() - start
        batches = self.eval_batches(case.model)
        with runner:
            start = time.perf_counter()
            candidate = concat([runner.infer(batch) for batch in batches])
            timings["run_s"] = time.perf_counter() - start
            built = runner.describe()
            if self.timing:
                batch = batches[0]
                items = len(next(iter(batch.values())))
                metrics_latency = time_call(lambda: runner.infer(batch), items=items).to_dict()
        comparison = compare(reference, candidate, tolerance, spec.task == "classification")
        metrics: dict[str, Any] = comparison.to_dict()
        if built:
            metrics["engine"] = built
        if self.timing:
            metrics["latency"] = metrics_latency
        if spec.eval_data is not None:
            self._task_accuracy(spec, reference, candidate, tolerance, comparison, metrics)
        status: Status = "passed" if comparison.passed else "failed"
        message = "" if comparison.passed else f"{case.id} vs FP32 reference:\n{comparison.explain()}"
        if not comparison.passed and case.backend == "onnxruntime" and spec.build is not None:
            divergence = first_divergence(self.fp32_onnx(case.model), artifacts.onnx_path(),
                                          batches[0], tolerance.min_cosine or 0.999)
            if divergence:
                metrics["first_divergence"] = divergence
                message += (f"\nfirst diverging layer: {divergence['node']} ({divergence['op']}) output "
                            f"{divergence['tensor']!r}, cosine {divergence['cosine']:.6f} < {divergence['bound']:g}")
        return CaseResult(case, status, message, metrics, tolerance.to_dict(), timings)

    def _task_accuracy(self, spec: ModelSpec, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                       tolerance: Any, comparison: Comparison, metrics: dict[str, Any]) -> None:
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


def _precision_order(name: str) -> int:
    order = ["fp32", "tf32", "fp16", "bf16", "int8", "fp8", "fp4"]
    return order.index(name) if name in order else len(order)
