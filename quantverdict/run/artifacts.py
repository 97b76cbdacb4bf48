"""Making a case's artifacts: torch module, FP32 ONNX, calibrated ranges, precision graph, batches,
FP32 reference outputs, the precision graph's semantics and a runtime's outputs.

Each is memoised per process and cached on disk under a content hash of everything that affects
it (:mod:`quantverdict.cache`), so hundreds of cases build each model and compute each reference once,
and a warm re-run only reads: the FP32 export is keyed by the model's build key (its source,
seed and versions: :meth:`ModelSpec.build_key`) so the module is not built to find it; outputs
are keyed by the exact graph or build, the input batches, and what the backend says decides its
numbers (:meth:`Backend.outputs_key`: runtime version, settings, CPU), or are not cached at all.
"""
from __future__ import annotations

import functools
import io
import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping

import numpy as np

from quantverdict.backends import Artifacts, Backend
from quantverdict.cache import Cache, content_hash, file_sha256, source_fingerprint
from quantverdict.capabilities import Capabilities, detect, package_version
from quantverdict.errors import CalibrationError
from quantverdict.export import export_onnx, load_onnx
from quantverdict.export.compat import at_opset, lowest_ir, opset_of, serialized
from quantverdict.export.torchscript import export_built
from quantverdict.judge.compare import concat
from quantverdict.judge.decided import undecided
from quantverdict.judge.mutations import Mutation
from quantverdict.judge.semantics import evaluate_semantics
from quantverdict.judge.tolerances import ToleranceTable
from quantverdict.models import ModelSpec
from quantverdict.models.spec import Batch
from quantverdict.precision import Recipe, get_recipe
from quantverdict.precision.calibrate import calibrate, channel_ranges
from quantverdict.precision.calibrators import Calibrator
from quantverdict.precision.graph import quantized_layers
from quantverdict.precision.qdq import QDQ
from quantverdict.registry import Registry

EVAL_BATCHES = 4  # synthetic evaluation batches, at least; more where the bounds need more samples
CALIBRATION_BATCHES = 4
EVAL_SEED, CALIBRATION_SEED = 1, 2
MEMO_SIZE = 4  # torch modules and reference outputs kept per process (ResNet-101 is large)


class _Memo:
    """A small least-recently-used table: ``get(key, make)`` calls ``make`` on a miss only."""

    def __init__(self, size: int | None = None):
        self.size, self.items = size, OrderedDict[Hashable, Any]()

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = self.items[key] = make()
        if self.size is not None and len(self.items) > self.size:
            self.items.popitem(last=False)
        return value


class ArtifactStore:
    """Everything a case consumes, made lazily; ``backend(name)`` supplies the reference runners."""

    def __init__(self, cache: Cache, models: Registry[ModelSpec], backend: Callable[[str], Backend],
                 tolerances: ToleranceTable, calibrator: Calibrator | None = None, caps: Capabilities | None = None,
                 recipe_settings: Mapping[str, Mapping[str, Any]] | None = None):
        self.cache, self.models, self.backend, self.calibrator = cache, models, backend, calibrator
        self.recipe_settings = recipe_settings or {}  # precision → settings over the models' own
        self.tolerances, self.caps = tolerances, caps or detect()
        self._modules, self._references, self._fp32 = _Memo(MEMO_SIZE), _Memo(MEMO_SIZE), _Memo()
        self._semantics, self._coverage, self._batch_keys, self._precision = _Memo(MEMO_SIZE), _Memo(), _Memo(), _Memo()
        self._evaluations, self._fallbacks, self._undecided = _Memo(MEMO_SIZE), _Memo(), _Memo()
        self.mutation: Mutation | None = None

    def mutated(self, mutation: Mutation) -> "ArtifactStore":
        """A store whose artifacts carry a planted defect; torch modules and FP32 reference outputs
        (which no defect touches) are shared with this one."""
        other = ArtifactStore(self.cache, self.models, self.backend, self.tolerances, self.calibrator, self.caps,
                              self.recipe_settings)
        other._modules, other._references, other.mutation = self._modules, self._references, mutation
        return other

    def _plant(self, stage: str, path: Path, precision: str | None = None) -> Path:
        """``path`` with the store's defect planted, if it acts at ``stage`` (and on ``precision``)."""
        mutation = self.mutation
        if mutation is None or mutation.stage != stage or (precision and precision not in mutation.precisions):
            return path
        import onnx

        source = path.read_bytes()
        key = content_hash("mutant", source, mutation.key(), source_fingerprint("quantverdict.judge.mutations"))
        return self.cache.get_or_create("mutant", key, ".onnx",
                                        lambda: serialized(mutation.graph(onnx.load_from_string(source))),
                                        {"mutation": mutation.name})

    def module(self, model: str) -> Any:
        """The torch module, built under the spec's seed so every build has the same weights."""
        def build() -> Any:
            import torch

            spec = self.models.get(model)
            assert spec.build is not None
            torch.manual_seed(spec.seed)
            return spec.call("build").eval()

        return self._modules.get(model, build)

    def fp32_onnx(self, model: str) -> Path:
        def make() -> Path:
            spec = self.models.get(model)
            if spec.onnx_path is not None:
                return self._plant("fp32", self._readable(spec.onnx_path))
            build_key = spec.build_key()
            if build_key is None:  # keyed by the built module's weights
                return self._plant("fp32", export_onnx(spec, self.module(model), self.cache))
            return self._plant("fp32", export_built(spec, "build:" + build_key, lambda: self.module(model), self.cache))

        return self._fp32.get(model, make)

    def _readable(self, path: Path) -> Path:
        """A user's ONNX file, checked (a missing or corrupt one is named), or a cached copy of it at the
        lowest IR version that holds it where its own is higher (:mod:`quantverdict.export.compat`)."""
        graph = load_onnx(path)
        if graph.ir_version <= lowest_ir(graph):
            return path
        key = content_hash("readable", file_sha256(path), source_fingerprint("quantverdict.export"))
        return self.cache.get_or_create("readable", key, ".onnx", lambda: serialized(graph), {"file": str(path)})

    def recipe_source(self, model: str, recipe: Recipe) -> Path:
        """The FP32 graph a recipe starts from: at the opset the recipe's operators need (float8 Q/DQ: 19),
        converted by onnx's version converter where the model's own opset is lower (cached)."""
        path = self.fp32_onnx(model)
        if not recipe.min_opset:
            return path
        import onnx

        graph = onnx.load(str(path))
        if opset_of(graph) >= recipe.min_opset:
            return path
        key = content_hash("opset", file_sha256(path), recipe.min_opset, package_version("onnx"),
                           source_fingerprint("quantverdict.export"))
        return self.cache.get_or_create(
            "opset", key, ".onnx", lambda: serialized(at_opset(graph, recipe.min_opset, f"the {recipe.name} recipe",
                                                               f"model {model!r}'s graph {path.name}")),
            {"model": model, "opset": recipe.min_opset})

    def ranges(self, model: str, recipe: Recipe) -> dict[str, float]:
        """Calibrated activation ranges for ``recipe`` (empty for uncalibrated recipes); cached."""
        return self._prepared_and_ranges(model, recipe)[1]

    def _prepared_and_ranges(self, model: str, recipe: Recipe) -> tuple[Any, dict[str, float]]:
        """The FP32 graph as the recipe prepares it (SmoothQuant, equalization: the same function) and
        the recipe's calibrated ranges of that graph; the FP32 graph and no ranges for uncalibrated recipes."""
        import onnx

        graph = onnx.load(str(self.recipe_source(model, recipe)))
        if not recipe.calibrated:
            return graph, {}
        graph = recipe.prepare(graph, lambda graph_bytes, tensors, axis: channel_ranges(
            self.cache, graph_bytes, tensors, axis, self.calibration_batches(model)))
        tensors = recipe.calibration_recipe().tensors_to_calibrate(graph)
        ranges = calibrate(self.cache, graph.SerializeToString(), tensors, self.calibration_batches(model),
                           recipe.calibrator)
        return graph, ranges

    def precision_onnx(self, model: str, recipe: Recipe) -> Path:
        """The FP32 graph transformed by ``recipe`` (calibrated first if it needs ranges), or the
        user's own quantized graph where the model spec names one for this precision.

        Keyed by what the graph is a function of (the FP32 graph's bytes, the recipe, the
        calibration batches, ONNX Runtime's version for the calibration pass, the recipe code), so
        a warm run finds it without parsing the FP32 graph or reading its ranges."""
        user_graph = self.models.get(model).quantized.get(recipe.name)
        if user_graph is not None:
            return self._plant("precision", self._readable(user_graph), recipe.name)

        def make() -> Path:
            calibrated = recipe.calibrated or recipe.calibration_data
            calibration = [self.data_key(model, "calibration"), package_version("onnxruntime")] if calibrated else None
            key = content_hash("precision", file_sha256(self.recipe_source(model, recipe)), recipe.params(), calibration,
                               source_fingerprint("quantverdict.precision"))

            def produce() -> bytes:
                if recipe.calibration_data:  # a recipe that calibrates itself from batches
                    import onnx

                    graph = onnx.load(str(self.recipe_source(model, recipe)))
                    return serialized(recipe.apply_batches(graph, self.calibration_batches(model)))
                graph, ranges = self._prepared_and_ranges(model, recipe)
                made = recipe.apply(graph, ranges)
                if recipe.calibrated:  # corrections measured on the calibration set (bias correction)
                    made = recipe.correct(made, graph, self.calibration_batches(model))
                return serialized(made)

            path = self.cache.get_or_create("precision", key, ".onnx", produce, {"model": model, **recipe.params()})
            return self._plant("precision", path, recipe.name)

        return self._precision.get((model, json.dumps(recipe.params(), sort_keys=True, default=str)), make)

    def calibration_batches(self, model: str) -> list[Batch]:
        spec = self.models.get(model)
        if spec.calibration is None:
            raise CalibrationError(
                f"model {model!r} has no calibration set: give it one in the manifest "
                "(calibration: module:callable) or set calibration: synthetic to calibrate on generated inputs")
        if spec.calibration == "synthetic":
            batches = spec.sample_batches(CALIBRATION_BATCHES, CALIBRATION_SEED)
        else:
            batches = spec.check_batches(spec.call("calibration"), "calibration")
        if self.mutation is not None and self.mutation.stage == "calibration":
            return self.mutation.batches(batches)
        return batches

    def eval_batches(self, model: str) -> list[Batch]:
        """The model's evaluation inputs if it has them, else synthetic batches, enough of them for every
        top-1 and accuracy bound of the model to be resolvable (one sample within each bound)."""
        return self._evaluation(model)[0]

    def eval_labels(self, model: str) -> np.ndarray | None:
        """The evaluation set's labels, or None (synthetic inputs, or inputs given without labels)."""
        return self._evaluation(model)[1]

    def _evaluation(self, model: str) -> tuple[list[Batch], np.ndarray | None]:
        """Made once per process: a user's evaluation callable may read its data from disk."""
        def make() -> tuple[list[Batch], np.ndarray | None]:
            spec = self.models.get(model)
            evaluation = spec.evaluation()
            if evaluation is not None:
                return evaluation
            per_batch = spec.inputs[0].shape[0]
            needed = self.tolerances.samples_to_resolve(model, spec.tolerances, labelled=False) \
                if spec.task == "classification" else 1
            return spec.sample_batches(max(EVAL_BATCHES, math.ceil(needed / per_batch)), EVAL_SEED), None

        return self._evaluations.get(model, make)

    def reference(self, model: str) -> dict[str, np.ndarray]:
        """FP32 reference outputs: the torch module (on CUDA when present, TF32 off), or ONNX Runtime
        for an ONNX-only model."""
        def compute() -> dict[str, np.ndarray]:
            backend = self._reference_backend(model)
            return self.run_outputs(model, backend, self.for_case(model, "fp32", backend))[0]

        return self._references.get(model, compute)

    def _reference_backend(self, model: str) -> str:
        """Where FP32 reference outputs come from: the torch module, or ONNX Runtime for an ONNX-only model."""
        return "torch" if self.models.get(model).build is not None else "onnxruntime"

    def undecided(self, model: str) -> np.ndarray | None:
        """The evaluation samples whose FP32 decision moves within half a step of an input's declared
        ``resolution`` (:mod:`quantverdict.judge.decided`): left out of top-1 agreement. None for a model that
        is no classifier or declares no resolution; cached as the reference outputs are."""
        spec = self.models.get(model)
        if spec.task != "classification" or all(item.resolution is None for item in spec.inputs):
            return None

        def make() -> np.ndarray:
            backend, output = self._reference_backend(model), spec.outputs[0]
            artifacts = self.for_case(model, "fp32", backend)

            def find() -> tuple[dict[str, np.ndarray], str]:
                with self.backend(backend).load(artifacts) as runner:
                    mask = undecided(self.reference(model)[output],
                                     lambda batches: concat([runner.infer(batch) for batch in batches])[output],
                                     self.eval_batches(model), spec.inputs)
                return {"undecided": mask}, ""

            parts = self.backend(backend).outputs_key(artifacts, self.caps)
            if parts is None:
                return find()[0]["undecided"]
            key = [parts, self.data_key(model, "evaluation"), [(item.name, item.resolution) for item in spec.inputs],
                   source_fingerprint("quantverdict.judge.decided")]
            return self._cached_arrays("undecided", key, find, {"model": model})[0]["undecided"]

        return self._undecided.get(model, make)

    def run_outputs(self, model: str, backend: str, artifacts: Artifacts) -> tuple[dict[str, np.ndarray], str]:
        """``backend``'s outputs on the evaluation batches and its runtime label: read from the
        cache where the backend can say what decides them, else run."""
        def run() -> tuple[dict[str, np.ndarray], str]:
            with self.backend(backend).load(artifacts) as runner:
                return concat([runner.infer(batch) for batch in self.eval_batches(model)]), runner.label()

        parts = self.backend(backend).outputs_key(artifacts, self.caps)
        if parts is None:
            return run()
        return self._cached_arrays("outputs", [parts, self.data_key(model, "evaluation")], run,
                                   {"model": model, "backend": backend, "precision": artifacts.recipe.name})

    def semantics(self, model: str, precision: str) -> dict[str, np.ndarray]:
        """The outputs of ``precision``'s graph evaluated as written (:mod:`quantverdict.judge.semantics`)."""
        return self._semantics.get((model, precision), lambda: self.graph_semantics(
            model, self.precision_onnx(model, self.recipe(model, precision, "emulated"))))

    def graph_semantics(self, model: str, path: Path, data: str = "evaluation") -> dict[str, np.ndarray]:
        """The outputs of the graph at ``path`` over ``model``'s evaluation (or calibration) batches,
        evaluated as written; cached by the graph's bytes, the batches, ONNX Runtime's version and the CPU."""
        parts = [file_sha256(path), self.data_key(model, data), *self.onnxruntime_cpu_parts("quantverdict.judge.semantics")]
        return self._cached_arrays("semantics", parts,
                                   lambda: (evaluate_semantics(path, self._batches(model, data)), ""),
                                   {"model": model, "graph": path.name, "data": data})[0]

    def fp32_outputs(self, model: str, data: str = "evaluation") -> dict[str, np.ndarray]:
        """What a recipe is judged against on ``data``: the reference outputs on the evaluation set,
        the FP32 graph's own on the calibration set."""
        if data == "evaluation":
            return self.reference(model)
        return self.graph_semantics(model, self.fp32_onnx(model), data)

    def _batches(self, model: str, data: str) -> list[Batch]:
        """The evaluation or the calibration batches (a user's calibration callable is called again)."""
        return self.eval_batches(model) if data == "evaluation" else self.calibration_batches(model)

    def data_key(self, model: str, data: str) -> str:
        """Content key of the evaluation or calibration batches, made once per process."""
        return self._batch_keys.get((data, model), lambda: self._batches_key(self._batches(model, data)))

    @staticmethod
    def _batches_key(batches: list[Batch]) -> str:
        return content_hash([[(name, batch[name]) for name in sorted(batch)] for batch in batches])

    def _cached_arrays(self, kind: str, parts: list[Any], make: Callable[[], tuple[dict[str, np.ndarray], str]],
                       describe: dict[str, Any]) -> tuple[dict[str, np.ndarray], str]:
        """Named arrays and a label, made once per content key and stored as .npz (no pickles)."""
        def produce() -> bytes:
            arrays, label = make()
            buffer = io.BytesIO()
            names = list(arrays)
            np.savez(buffer, __meta__=np.array(json.dumps({"names": names, "label": label})),
                     **{f"a{i}": np.asarray(arrays[name]) for i, name in enumerate(names)})
            return buffer.getvalue()

        path = self.cache.get_or_create(kind, content_hash(kind, parts), ".npz", produce, describe)
        with np.load(path, allow_pickle=False) as stored:
            meta = json.loads(str(stored["__meta__"]))
            return {name: stored[f"a{i}"] for i, name in enumerate(meta["names"])}, meta["label"]

    def coverage(self, model: str, precision: str) -> dict[str, int]:
        """How many of ``precision``'s weighted layers take a dequantized weight (:func:`quantized_layers`)."""
        def count() -> dict[str, int]:
            import onnx

            path = self.precision_onnx(model, self.recipe(model, precision, "emulated"))
            return self.cached_json("coverage", [file_sha256(path), source_fingerprint("quantverdict.precision.graph")],
                                    lambda: quantized_layers(onnx.load(str(path))),
                                    {"model": model, "precision": precision})

        return self._coverage.get((model, precision), count)

    def cached_json(self, kind: str, parts: list[Any], make: Callable[[], Any], describe: dict[str, Any]) -> Any:
        """A JSON-able result made once per content key of ``parts`` (a diagnosis, a count)."""
        path = self.cache.get_or_create(kind, content_hash(kind, parts), ".json",
                                        lambda: json.dumps(make(), default=str).encode(), describe)
        return json.loads(path.read_text())

    def batch_key(self, batch: Batch) -> str:
        return self._batches_key([batch])

    def onnxruntime_cpu_parts(self, code: str) -> list[Any]:
        """Key parts of anything ONNX Runtime computes on this CPU: its version, the CPU, and the
        harness ``code`` (module) that drives it."""
        return [package_version("onnxruntime"), self.caps.cpu.identity if self.caps.cpu else None,
                source_fingerprint(code)]

    def for_case(self, model: str, precision: str, backend: str) -> Artifacts:
        """Lazy handles on what ``backend`` needs for ``model`` in ``precision``."""
        spec = self.models.get(model)
        recipe = self.recipe(model, precision, self.backend(backend).recipe_target)
        module = None if spec.build is None else functools.partial(self.module, model)
        ranges_suffice = recipe.ranges_describe_it and recipe.name not in spec.quantized
        return Artifacts(spec, recipe, module, onnx_path=lambda: self.precision_onnx(model, recipe),
                         fp32_onnx=lambda: self.fp32_onnx(model),
                         ranges=(lambda: self.ranges(model, recipe)) if ranges_suffice else None,
                         calibration_batches=lambda: self.calibration_batches(model), cache=self.cache)

    def recipe(self, model: str, precision: str, target: str) -> Recipe:
        """The recipe of ``precision`` for a graph target, with the model's recipe settings, then
        this run's (``--recipe-option``, ``--calibration``) over them."""
        recipe = get_recipe(precision).for_target(target)
        if not recipe.configurable:  # FP16, or a runtime's own layout (ONNX Runtime's CPU INT8)
            return recipe
        settings = {**self.models.get(model).recipe.get(precision, {}), **self.recipe_settings.get(precision, {})}
        if self.calibrator is not None and recipe.calibrated:
            settings["calibration"] = self.calibrator.method
        return self.with_fallback(model, recipe.configured(settings))

    def with_fallback(self, model: str, recipe: Recipe) -> Recipe:
        """``recipe`` with the layers its accuracy-aware fallback keeps in FP32 chosen, the most
        sensitive on the calibration set (:func:`choose_fallback`); made once per content key of what
        decides them, as the graphs it judges are. A recipe without ``fallback`` is returned as is."""
        from quantverdict.judge.sensitivity import choose_fallback

        if not recipe.fallback_pending:
            return recipe
        assert isinstance(recipe, QDQ)

        def choose() -> list[str]:
            parts = [file_sha256(self.fp32_onnx(model)), recipe.params(),
                     self.data_key(model, "calibration"), *self.onnxruntime_cpu_parts("quantverdict.judge"),
                     source_fingerprint("quantverdict.precision"),
                     None if self.mutation is None else [self.mutation.key(), self.mutation.precisions]]
            return self.cached_json("fallback", parts, lambda: choose_fallback(self, model, recipe),
                                    {"model": model, "precision": recipe.name})

        kept = self._fallbacks.get((model, json.dumps(recipe.params(), sort_keys=True, default=str)), choose)
        return recipe.with_options(fallback_layers=tuple(kept))
