"""Running one case: load the backend's runner over the case's artifacts, run the evaluation set,
judge the outputs, and turn every failure into data with a message that names the case.

A quantized case gets two verdicts besides the runtime's own outputs against FP32:
- *recipe accuracy*: the precision graph's semantics (:mod:`quantverdict.judge.semantics`) against
  FP32 under the tolerance table: what the recipe means, the same on every CPU;
- *runtime fidelity*: the runtime's outputs against those semantics, under a bound derived
  from the graph's quantization noise (:mod:`quantverdict.judge.fidelity`).
A failure says which one failed: "the recipe regressed" or "runtime diverges from the graph".
"""
from __future__ import annotations

import time
import traceback
from typing import Any, Callable

import numpy as np

from quantverdict import freed_memory
from quantverdict.backends import Artifacts, Backend, infer_all
from quantverdict.backends.base import BUILD_OPTIONS, ENGINE_PLAN
from quantverdict.backends.samples import joined
from quantverdict.capabilities import Capabilities, physical_memory
from quantverdict.errors import (HarnessError, InputSpecError, UnsupportedError, UserCodeError, interrupted,
                                 user_trace)
from quantverdict.hashing import content_hash, file_sha256
from quantverdict.heartbeat import told
from quantverdict.judge.by_kind import ByKind
from quantverdict.judge.coverage import coverage_verdict
from quantverdict.judge.compare import Comparison, judge_task_metrics, task_accuracy
from quantverdict.judge.diagnose import first_divergence
from quantverdict.judge.overflow import Overflow, overflow_message, overflows
from quantverdict.judge.fidelity import Fidelity, judge_fidelity
from quantverdict.judge.timed import judge_timed_outputs
from quantverdict.judge.tolerances import Tolerance, ToleranceTable
from quantverdict.models import ModelSpec
from quantverdict.models.data import batches_key
from quantverdict.models.spec import Batch, sample_count
from quantverdict.perf.bench import time_call
from quantverdict.gpu_slot import this_gpu, timing_slot
from quantverdict.run.artifacts import ArtifactStore
from quantverdict.run.cases import Case, CaseResult
from quantverdict.tune.decide import decided_before_calibration
from quantverdict.tune.resolve import Resolver


class CaseExecutor:
    """Runs cases over an :class:`ArtifactStore`, their recipes finished by ``recipes``; ``caps`` says where runtimes
    run (for messages); ``timing`` also measures each case's latency."""

    def __init__(self, store: ArtifactStore, recipes: Resolver, tolerances: ToleranceTable,
                 backend: Callable[[str], Backend], caps: Capabilities, timing: bool = False):
        self.store, self.recipes, self.tolerances, self.backend = store, recipes, tolerances, backend
        self.caps, self.timing = caps, timing

    def artifacts(self, model: str, precision: str, backend: str) -> Artifacts:
        """What ``backend`` runs for ``model`` in ``precision``: the recipe finished for its graph target, the graphs
        made lazily."""
        recipe = self.recipes.recipe(model, precision, self.backend(backend).recipe_target)
        return self.store.for_case(model, recipe, backend)

    def run(self, case: Case) -> CaseResult:
        """Run one case; bad input becomes an ``error`` result whose message names the problem."""
        try:
            with freed_memory.kept():
                return self._run(case)
        except UnsupportedError as exc:
            if self.store.models.get(case.model).declared_unsupported(case.backend, exc.ops):
                return CaseResult(case, "skipped", f"{', '.join(exc.ops)} declared unsupported on {case.backend} "
                                                   f"in the model spec: {exc}")
            return CaseResult(case, "error", f"{case.id}: {exc}")
        except (UserCodeError, InputSpecError) as exc:  # the user's own code: which callable, and its frames
            return CaseResult(case, "error", f"{case.id}: {exc}\n{exc.trace}".rstrip(), trace=exc.trace)
        except HarnessError as exc:
            return CaseResult(case, "error", f"{case.id}: {exc}")
        except Exception as exc:  # a backend crash is a regression too: keep the trace
            if interrupted(exc):  # a Ctrl-C that a library's import turned into another error
                raise KeyboardInterrupt from exc
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return CaseResult(case, "error", f"{case.id}: {detail}", trace=user_trace(exc))

    def _run(self, case: Case) -> CaseResult:
        store = self.store
        spec = store.models.get(case.model)
        too_large = spec.memory_problem(physical_memory())
        if too_large:  # before anything is built: a MemoryError minutes later names nothing
            return CaseResult(case, "error", f"{case.id}: {too_large}")
        tolerance = self.tolerances.resolve(case.model, case.precision, spec.tolerances, spec.task)
        timings: dict[str, float] = {}
        backend = self.backend(case.backend)
        if backend.runs_recipe_graph and case.precision not in spec.quantized:
            decided = decided_before_calibration(self.recipes, case.model, case.precision, backend.recipe_target)
            if decided is not None:  # by the recipe's placement on the FP32 graph: nothing calibrated or searched
                why = decided.message if decided.status == "skipped" else f"{case.id}: {decided.message}"
                return CaseResult(case, decided.status, why, {"coverage": decided.coverage,
                                                              "decided": "before calibration, by the placement"})
        artifacts = self.artifacts(case.model, case.precision, case.backend)
        coverage = backend.coverage(artifacts)
        if coverage is not None:  # what ran in the precision decides whether a verdict can bear its name
            coverage = {key: value for key, value in coverage.items() if key not in ("graph", "evaluator")}
            who = case.backend if not backend.runs_recipe_graph else \
                "the graph you supplied" if case.precision in spec.quantized else "the recipe"
            problem = coverage_verdict(coverage, case.precision, case.model, who)
            if problem is not None:
                status, why = problem
                return CaseResult(case, status, why if status == "skipped" else f"{case.id}: {why}",
                                  {"coverage": coverage})
        start = time.perf_counter()
        reference = store.reference(case.model)
        timings["reference_s"] = time.perf_counter() - start
        batches = store.eval_batches(case.model)
        built: dict[str, Any] = {}
        if self.timing or backend.outputs_key(artifacts, self.caps) is None:
            start = time.perf_counter()
            runner = backend.load(artifacts)
            timings["prepare_s"] = time.perf_counter() - start
            with runner:
                start = time.perf_counter()
                candidate = infer_all(runner, batches)
                timings["run_s"] = time.perf_counter() - start
                built, runtime = runner.describe(), runner.label()
                if self.timing:
                    items = sample_count(batches[0])
                    with timing_slot(this_gpu() if self.caps.gpu is not None else None):  # the GPU to itself
                        latency = time_call(lambda: runner.infer(batches[0]), items=items)
        else:  # outputs fixed by what the backend names: read them if an earlier run made them
            start = time.perf_counter()
            candidate, runtime = store.run_outputs(case.model, case.backend, artifacts)
            timings["outputs_s"] = time.perf_counter() - start
        runtime_cmp = self._judge(spec, case.precision, reference, candidate, tolerance)
        metrics: dict[str, Any] = {**runtime_cmp.to_dict(), "runtime": runtime,
                                   "fingerprint": self._fingerprint(case, artifacts, backend, spec, tolerance, built)}
        if coverage is not None:
            metrics["coverage"] = coverage
        if built:
            metrics["engine"] = built
        timed = None
        if self.timing:
            metrics["latency"] = latency.to_dict()
            first = {name: values[:items] for name, values in reference.items()}
            timed = judge_timed_outputs({name: values[:items] for name, values in candidate.items()},
                                        [joined([outputs], batches[:1]) for outputs in latency.sampled], first,
                                        tolerance, spec.task == "classification")
            metrics["timed_outputs"] = timed.to_dict()
        recipe_cmp = fidelity = None
        if artifacts.recipe.quantized and backend.runs_recipe_graph:
            start = time.perf_counter()
            recipe_cmp, fidelity = self._recipe_and_fidelity(case, spec, reference, candidate, runtime, tolerance,
                                                             metrics)
            timings["semantics_s"] = time.perf_counter() - start
        passed = runtime_cmp.passed and (recipe_cmp is None or recipe_cmp.passed) and (fidelity is None or fidelity.passed)
        message = "" if passed else self._explain(case, artifacts, backend, batches[0], runtime_cmp,
                                                  recipe_cmp, fidelity, tolerance, metrics)
        if timed is not None and not timed.passed:
            passed, message = False, "\n".join(filter(None, [message, f"{case.id}: {timed.explain()}"]))
        note = metrics.get("recipe", {}).get("lock", {}).get("note")
        if note:  # a verdict on a recipe reviewed for another graph says so, passed or not
            message = "\n".join(filter(None, [message, f"{case.id}: {note}"]))
        return CaseResult(case, "passed" if passed else "failed", message, metrics, tolerance.to_dict(), timings)

    def _fingerprint(self, case: Case, artifacts: Artifacts, backend: Backend, spec: ModelSpec,
                     tolerance: Tolerance, built: dict[str, Any]) -> dict[str, str]:
        """Content keys of what decides the case (graph, data, recipe, precision graph, an engine's build options,
        bounds): two records then say which of them moved between two runs (:mod:`quantverdict.report.moved`)."""
        store, recipe = self.store, artifacts.recipe
        found = {"graph": store.fp32_sha256(case.model),
                 "evaluation": store.data_key(case.model, "evaluation"), "recipe": content_hash(recipe.params()),
                 "tolerance": content_hash(tolerance.to_dict())}
        if built.get(BUILD_OPTIONS):  # TensorRT's flags, shapes and GPU
            found["engine"] = content_hash(built[BUILD_OPTIONS])
        if built.get(ENGINE_PLAN):  # the engine itself: the tactics its build chose
            found["plan"] = built[ENGINE_PLAN]
        if recipe.quantized and backend.runs_recipe_graph:
            if case.precision not in spec.quantized and spec.calibration is not None:
                found["calibration"] = store.data_key(case.model, "calibration")
            found["qdq"] = file_sha256(store.precision_onnx(case.model, recipe))
        return found

    def _recipe_and_fidelity(self, case: Case, spec: ModelSpec, reference: dict[str, np.ndarray],
                             candidate: dict[str, np.ndarray], runtime: str, tolerance: Tolerance,
                             metrics: dict[str, Any]) -> tuple[Comparison, Fidelity]:
        """The recipe judged on its graph's semantics, and the runtime judged against them."""
        store, resolved = self.store, self.recipes.resolved(case.model, case.precision)
        semantics = store.semantics(case.model, resolved.recipe)
        recipe = self._judge(spec, case.precision, reference, semantics, tolerance)
        labels = frozenset(name for name, kind in store.output_kinds(case.model).items() if kind == "labels")
        fidelity = judge_fidelity(reference, semantics, candidate, runtime, self.caps.device,
                                  tolerance.max_flip_fraction, labels)
        coverage = dict(store.coverage(case.model, resolved.recipe))
        graph, evaluator = coverage.pop("graph"), coverage.pop("evaluator")
        metrics["recipe"] = {**recipe.to_dict(), "evaluator": evaluator, "passed": recipe.passed, "coverage": coverage,
                             "settings": resolved.recipe.params()}
        if resolved.search is not None:  # recipe: auto: every candidate's score on held-out data, and the choice
            metrics["recipe"]["search"] = resolved.search.to_dict()
        if resolved.lock is not None:  # the lock's recipe, no search: which lock, whether chosen for this graph
            metrics["recipe"]["lock"] = resolved.lock.to_dict()
        if case.precision in spec.quantized:  # the user's graph, as it is: no recipe settings made it
            metrics["recipe"].update(user_graph=str(spec.quantized[case.precision]), settings=graph)
        metrics["fidelity"] = fidelity.to_dict()
        return recipe, fidelity

    def _judge(self, spec: ModelSpec, precision: str, reference: dict[str, np.ndarray],
               outputs: dict[str, np.ndarray], tolerance: Tolerance) -> Comparison:
        """Outputs against the FP32 reference, each under the bounds of its kind (a probability map is not judged
        by a logits bound: :mod:`quantverdict.judge.output_kinds`), top-1 on the samples FP32 decides (where an
        input declares its resolution) and at each position of a distribution, the model's task metrics, and task
        accuracy where a classifier has labels (a regression model's labels are its metric's only: argmax of a
        pitch or a score is no accuracy)."""
        # the declared outputs only: a graph's others (a classifier's int64 label) are not the user's to judge
        reference = {name: reference[name] for name in spec.outputs if name in reference}
        outputs = {name: outputs[name] for name in reference if name in outputs}
        kinds = self.store.output_kinds(spec.name)
        judging = ByKind.of(spec, kinds, self.tolerances, precision, tolerance)
        comparison = judging.compare(reference, outputs, self.store.undecided(spec.name))
        labels = self.store.eval_labels(spec.name)
        if spec.task_metric() is not None:
            judge_task_metrics(spec.call("metric", reference, outputs, labels), tolerance, comparison,
                               spec.describe("metric"))
        if labels is not None and spec.task == "classification":
            output = spec.outputs[0]
            chosen = (lambda values: values) if kinds.get(output) == "labels" else (lambda values: values.argmax(-1))
            comparison.task = task_accuracy(chosen(reference[output]) == labels, chosen(outputs[output]) == labels,
                                            tolerance, comparison)
        return comparison

    def _explain(self, case: Case, artifacts: Artifacts, backend: Backend, first_batch: Batch, runtime_cmp: Comparison,
                 recipe_cmp: Comparison | None, fidelity: Fidelity | None, tolerance: Tolerance,
                 metrics: dict[str, Any]) -> str:
        """Which verdict failed, in words a person can act on, with where the divergence starts (an overflow of
        the storage format first: it decides everything after it)."""
        overflow = self._overflow(case, artifacts, tolerance)
        if overflow:
            metrics["overflow"] = overflow
            head = overflow_message(case.id, case.precision.upper(), overflow)
        if recipe_cmp is not None and not recipe_cmp.passed:
            evaluator = metrics.get("recipe", {}).get("evaluator", "its semantics")
            lines = [f"{case.id}: the recipe regressed: its graph's semantics ({evaluator}) vs FP32 reference:",
                     recipe_cmp.explain()]
            divergence = self._semantic_divergence(case, artifacts, first_batch, tolerance)
        elif fidelity is not None and not fidelity.passed:
            return self._blame_runtime(case, artifacts, backend, fidelity, first_batch, metrics)
        else:
            lines = [f"{case.id} vs FP32 reference:", runtime_cmp.explain()]
            if recipe_cmp is not None:
                lines.append("(the recipe and the runtime's fidelity each pass their bounds; together they exceed "
                             "the tolerance)")
            divergence = self._semantic_divergence(case, artifacts, first_batch, tolerance)
        if divergence:
            metrics["first_divergence"] = divergence
            lines.append(f"first diverging layer: {divergence['node']} ({divergence['op']}) output "
                         f"{divergence['tensor']!r}, {divergence['summary']}")
        return "\n".join([head, *lines] if overflow else lines)

    def _overflow(self, case: Case, artifacts: Artifacts, tolerance: Tolerance) -> Overflow | None:
        """The tensor whose overflow of the recipe's storage format breaks the output, among all that overflow
        (:func:`overflows`, cached)."""
        recipe = artifacts.recipe
        if recipe.storage_limit is None or recipe.storage_type is None:
            return None
        fp32, key = self.store.fp32_onnx(case.model), self.store.data_key(case.model, "evaluation")
        bound = tolerance.min_cosine or 0.999
        return self.store.cache.json(
            "overflow", [file_sha256(fp32), key, recipe.storage_limit, recipe.storage_type, bound,
                         *self.store.onnxruntime_cpu_parts("quantverdict.judge.overflow")],
            lambda: told(self.recipes.options.progress, f"{case.id}: finding which tensors overflow "
                         f"{case.precision.upper()} and which of them break the output", lambda: overflows(
                             fp32, self.store.eval_batches(case.model), recipe.storage_limit, recipe.storage_type,
                             bound)), {"case": case.id})

    def _blame_runtime(self, case: Case, artifacts: Artifacts, backend: Backend, fidelity: Fidelity, batch: Batch,
                       metrics: dict[str, Any]) -> str:
        """A runtime that left the graph: which, where it ran, and what its backend can say of where."""
        lines = [f"{case.id}: {fidelity.explain()}", "the recipe itself is within its tolerance "
                 "(judged on the graph's semantics): this is the runtime, not the recipe"]
        progress = self.recipes.options.progress
        diagnosis = backend.diagnose(artifacts, batch, fidelity.outputs[0].bound, self.caps,
                                     None if progress is None else lambda line: progress(f"{case.id}: {line}"))
        lines += diagnosis.notes
        divergence = diagnosis.divergence
        if divergence:
            metrics["first_runtime_divergence"] = divergence
            lines.append(f"first diverging node: {divergence['node']} ({divergence['op']}): its quantized "
                         f"output {divergence['tensor']!r} differs from the graph's by ≥ 2 steps on "
                         f"{100 * divergence['fraction']:.3g}% of elements (at most {divergence['max_steps']})")
        return "\n".join(lines)

    def _semantic_divergence(self, case: Case, artifacts: Artifacts, batch: Batch, tolerance: Tolerance) -> dict | None:
        """The first layer of the precision graph, evaluated as written, that leaves the FP32 graph."""
        if self.store.models.get(case.model).build is None:
            return None
        if case.backend != "onnxruntime" and not artifacts.recipe.quantized:
            return None  # a backend's own float kernels are not what the emulated graph describes
        fp32 = self.store.fp32_onnx(case.model)
        emulated = self.store.precision_onnx(case.model, self.recipes.recipe(case.model, case.precision, "emulated"))
        bound = tolerance.min_cosine or 0.999
        return self.store.cache.json(
            "divergence", [file_sha256(fp32), file_sha256(emulated), batches_key([batch]), bound,
                           *self.store.onnxruntime_cpu_parts("quantverdict.judge.diagnose")],
            lambda: told(self.recipes.options.progress, f"{case.id}: finding the first layer where the recipe's graph "
                         "leaves FP32's", lambda: first_divergence(fp32, emulated, batch, bound)), {"case": case.id})
