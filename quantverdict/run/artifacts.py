"""A run's artifacts, composed from the stages' lazy loaders and memoised per process: the torch module and
batches (:mod:`quantverdict.models.data`), the FP32 graph (:mod:`quantverdict.export.loader`), the precision
graph (:mod:`quantverdict.precision.loader`), a runtime's outputs (:mod:`quantverdict.backends.loader`)
and a graph's semantics (:mod:`quantverdict.judge.semantics`).

Each loader keys its artifact on disk by a content hash of everything that affects it, so hundreds of cases
build each model and compute each reference once, and a warm re-run only reads. The store is the judge's
:class:`~quantverdict.judge.workbench.Workbench`. It takes finished recipes (resolved in
:mod:`quantverdict.tune.resolve`, which it never calls); its data and its defect are values it is given (a
:class:`~quantverdict.models.data.BatchSource`, a :class:`~quantverdict.run.views.Planter`), never subclasses.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from quantverdict.backends import Artifacts, Backend, infer_all
from quantverdict.backends.loader import RuntimeOutputs
from quantverdict.backends.samples import CODE as JOINING
from quantverdict.cache import Cache
from quantverdict.capabilities import Capabilities, detect, package_version
from quantverdict.export.loader import AtOpset, Fp32Graph, Normalised, readable
from quantverdict.hashing import content_hash, file_sha256, source_fingerprint
from quantverdict.judge.decided import undecided
from quantverdict.judge.layer_errors import Errors, views_of
from quantverdict.judge.layers_alone import CODE as LAYERS_ALONE_CODE, each_alone
from quantverdict.judge.output_kinds import output_kinds
from quantverdict.judge.semantics import CODE as SEMANTICS_CODE, Semantics, evaluator as semantics_evaluator
from quantverdict.judge.semantics import unkept_semantics
from quantverdict.judge.tolerances import ToleranceTable
from quantverdict.models.data import BatchSource, Data, OwnData, batches_key, build_module
from quantverdict.models.spec import Batch, ModelSpec
from quantverdict.precision import Recipe, get_recipe
from quantverdict.precision.describe import describe_quantization
from quantverdict.precision.coverage import planned_coverage, recipe_coverage
from quantverdict.precision.loader import PrecisionGraph
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.single_layer import derivable
from quantverdict.memo import Memo
from quantverdict.registry import Registry
from quantverdict.run.views import MEMO_SIZE, Planter, Shared

if TYPE_CHECKING:
    import torch


class ArtifactStore:
    """Everything a case consumes, made lazily; ``backend(name)`` supplies the reference runners; ``data`` gives the
    batches (the models' own by default), ``planter`` plants a defect (none by default)."""

    def __init__(self, cache: Cache, models: Registry[ModelSpec], backend: Callable[[str], Backend],
                 tolerances: ToleranceTable, caps: Capabilities | None = None, data: BatchSource | None = None,
                 planter: Planter | None = None, shared: Shared | None = None):
        self.cache, self.models, self.backend = cache, models, backend
        self.tolerances, self.caps = tolerances, caps or detect()
        self.data, self.planter, self.shared = data or OwnData(), planter or Planter(), shared or Shared()
        self._semantics, self._coverage, self._batch_keys, self._precision = Memo(MEMO_SIZE), Memo(), Memo(), Memo()
        self._evaluations, self._undecided = Memo(MEMO_SIZE), Memo()

    def on_batches(self, data: BatchSource) -> "ArtifactStore":
        """The same models judged on ``data`` with no defect planted: the torch modules and FP32 graphs shared."""
        return ArtifactStore(self.cache, self.models, self.backend, self.tolerances, self.caps, data,
                             shared=Shared(modules=self.shared.modules, fp32=self.shared.fp32))

    def planted_with(self, planter: Planter) -> "ArtifactStore":
        """The same models with ``planter``'s defect: the torch modules and FP32 reference outputs, which no defect
        touches, shared."""
        return ArtifactStore(self.cache, self.models, self.backend, self.tolerances, self.caps, self.data, planter,
                             Shared(modules=self.shared.modules, references=self.shared.references))

    def variant(self) -> Any:
        """What besides the data makes this store's choices differ (a planted defect), for their keys."""
        return self.planter.key()

    def spec(self, model: str) -> ModelSpec:
        return self.models.get(model)

    def module(self, model: str) -> "torch.nn.Module":
        """The torch module, built under the spec's seed."""
        return self.shared.modules.get(model, lambda: build_module(self.spec(model)))

    def fp32_onnx(self, model: str) -> Path:
        return self.shared.fp32.get(model, lambda: self.planter.graph(
            "fp32", Fp32Graph(self.spec(model), functools.partial(self.module, model), self.cache)()))

    def fp32_sha256(self, model: str) -> str:
        """The FP32 graph's sha256: what a lock entry, a search's cache key and a record's fingerprint name it by."""
        return file_sha256(self.fp32_onnx(model))

    def recipe_source(self, model: str, recipe: Recipe) -> Path:
        """The FP32 graph a recipe starts from, at the opset its operators need (float8 Q/DQ: 19)."""
        return AtOpset(functools.partial(self.fp32_onnx, model), recipe.min_opset, f"the {recipe.name} recipe",
                       f"model {model!r}'s graph", self.cache)()

    def precision_graph(self, model: str, recipe: Recipe) -> PrecisionGraph:
        return PrecisionGraph(functools.partial(self.recipe_source, model, recipe), recipe,
                              functools.partial(self.calibration_batches, model),
                              functools.partial(self.data_key, model, "calibration"), self.cache, model)

    def precision_onnx(self, model: str, recipe: Recipe) -> Path:
        """The recipe's graph, or the user's own quantized graph where the spec names one for this precision."""
        user_graph = self.spec(model).quantized.get(recipe.name)
        if user_graph is not None:
            graph = Normalised(functools.partial(readable, user_graph, self.cache), self.cache)
            return self.planter.graph("precision", graph(), recipe.name)
        key = (model, json.dumps(recipe.params(), sort_keys=True, default=str))
        return self._precision.get(key, lambda: self.planter.graph("precision", self.precision_graph(model, recipe)(),
                                                                   recipe.name))

    def ranges(self, model: str, recipe: Recipe) -> dict[str, float]:
        """Calibrated activation ranges for ``recipe`` (empty for uncalibrated recipes); cached."""
        return self.precision_graph(model, recipe).ranges()

    def calibration_batches(self, model: str) -> list[Batch]:
        return self.planter.batches(self.data.calibration(self.spec(model)))

    def eval_batches(self, model: str) -> list[Batch]:
        """The model's evaluation inputs, or synthetic batches enough for every top-1 bound to resolve."""
        return self._evaluation(model)[0]

    def eval_labels(self, model: str) -> np.ndarray | None:
        return self._evaluation(model)[1]

    def _evaluation(self, model: str) -> tuple[list[Batch], np.ndarray | None]:
        """Made once per process: a user's evaluation callable may read its data from disk."""
        def make() -> tuple[list[Batch], np.ndarray | None]:
            spec = self.spec(model)
            needed = self.tolerances.samples_to_resolve(model, spec.tolerances, labelled=False) \
                if spec.task == "classification" else 1
            return self.data.evaluation(spec, needed)

        return self._evaluations.get(model, make)

    def batches(self, model: str, data: Data) -> list[Batch]:
        """The evaluation or the calibration batches (a user's calibration callable is called again)."""
        return self.eval_batches(model) if data == "evaluation" else self.calibration_batches(model)

    def data_key(self, model: str, data: Data) -> str:
        """Content key of the evaluation or calibration batches, made once per process."""
        return self._batch_keys.get((data, model), lambda: batches_key(self.batches(model, data)))

    def reference(self, model: str) -> dict[str, np.ndarray]:
        """FP32 reference outputs: the torch module (on CUDA when present, TF32 off), or ONNX Runtime for an
        ONNX-only model."""
        def compute() -> dict[str, np.ndarray]:
            backend = self.reference_backend(model)
            return self.run_outputs(model, backend, self.for_case(model, get_recipe("fp32"), backend))[0]

        return self.shared.references.get(model, compute)

    def reference_backend(self, model: str) -> str:
        return "torch" if self.spec(model).build is not None else "onnxruntime"

    def undecided(self, model: str) -> np.ndarray | None:
        """The evaluation samples whose FP32 decision moves within half a step of an input's declared
        ``resolution`` (:mod:`quantverdict.judge.decided`), left out of top-1 agreement; None for a model that
        is no classifier or declares no resolution; cached as the reference outputs are."""
        spec = self.spec(model)
        if self.data.held_out or spec.task != "classification" or all(item.resolution is None for item in spec.inputs):
            return None

        def make() -> np.ndarray:
            name, output = self.reference_backend(model), spec.outputs[0]
            backend, artifacts = self.backend(name), self.for_case(model, get_recipe("fp32"), name)

            def find() -> tuple[dict[str, np.ndarray], str]:
                with backend.load(artifacts) as runner:
                    mask = undecided(self.reference(model)[output], lambda batches: infer_all(runner, batches)[output],
                                     self.eval_batches(model), spec.inputs)
                return {"undecided": mask}, ""

            parts = backend.outputs_key(artifacts, self.caps)
            if parts is None:
                return find()[0]["undecided"]
            key = [parts, self.data_key(model, "evaluation"), [(item.name, item.resolution) for item in spec.inputs],
                   source_fingerprint("quantverdict.judge.decided", JOINING)]
            return self.cache.arrays("undecided", key, find, {"model": model})[0]["undecided"]

        return self._undecided.get(model, make)

    def run_outputs(self, model: str, backend: str, artifacts: Artifacts) -> tuple[dict[str, np.ndarray], str]:
        """``backend``'s outputs on the evaluation batches and its runtime label (cached where it can be)."""
        return RuntimeOutputs(self.backend(backend), artifacts, functools.partial(self.eval_batches, model),
                              functools.partial(self.data_key, model, "evaluation"), self.caps, self.cache)()

    def semantics(self, model: str, recipe: Recipe) -> dict[str, np.ndarray]:
        """The outputs of ``recipe``'s graph evaluated as written (:mod:`quantverdict.judge.semantics`)."""
        key = (model, json.dumps(recipe.params(), sort_keys=True, default=str))
        return self._semantics.get(key, lambda: self.graph_semantics(model, self.precision_onnx(model, recipe)))

    def graph_semantics(self, model: str, path: Path, data: Data = "evaluation") -> dict[str, np.ndarray]:
        return Semantics(path, functools.partial(self.batches, model, data), self.data_key(model, data),
                         self.onnxruntime_cpu_parts(*SEMANTICS_CODE), self.cache,
                         {"model": model, "graph": path.name, "data": data})()

    def recipe_semantics(self, model: str, recipe: Recipe, data: Data = "evaluation") -> dict[str, np.ndarray]:
        """``recipe``'s graph evaluated as written on ``data``, cached by what makes the graph, the graph not kept: a
        layer quantized alone for sensitivity and fallback is a copy of the model (MiniLM's search kept 16 GB)."""
        graph = self.precision_graph(model, recipe)
        parts = [graph.key(), self.data_key(model, data), *self.onnxruntime_cpu_parts(*SEMANTICS_CODE)]
        return self.cache.arrays("semantics", parts,
                                 lambda: (unkept_semantics(graph.make(), self.batches(model, data)), ""),
                                 {"model": model, "recipe": recipe.params(), "data": data})[0]

    def layers_alone_errors(self, model: str, recipe: QDQ, layers: Sequence[str], data: Data = "evaluation",
                            kept_in: str | None = None) -> list[Errors]:
        """Each of ``layers`` quantized alone by ``recipe`` (its ``only``), or kept alone in the wider format
        ``kept_in`` (its fallback, nothing quantized), evaluated as written on ``data``, as its errors against the FP32
        outputs there (:class:`Errors`: a few floats per sample, not the outputs), each cached; those missing made
        together from one preparation, calibration and rounding (:mod:`quantverdict.precision.single_layer`), in
        parallel and from each layer's cut (:mod:`quantverdict.judge.layers_alone`)."""
        alone = [recipe.with_options(only=(layer,)) if kept_in is None else recipe.with_options(
            only=(), fallback_layers=(layer,), fallback_format=(kept_in,)) for layer in layers]
        reference = self.fp32_outputs(model, data)
        views = views_of(self.spec(model).detections, reference)  # a detector head: the anchors FP32 keeps
        if not derivable(recipe):
            return [Errors.of(reference, self.recipe_semantics(model, each, data), views) for each in alone]
        cpu = self.onnxruntime_cpu_parts(*SEMANTICS_CODE, *LAYERS_ALONE_CODE)
        against = content_hash(reference, repr(self.spec(model).detections))  # torch's reference: its version no part
        parts = {layer: [self.precision_graph(model, each).key(), self.data_key(model, data), against, *cpu]
                 for layer, each in zip(layers, alone)}
        described = {layer: {"model": model, "recipe": each.params(), "data": data}
                     for layer, each in zip(layers, alone)}
        missing = [layer for layer in layers if not self.cache.holds_arrays("layer-errors", parts[layer])]
        if missing:
            made_from = recipe if kept_in is None else recipe.with_options(fallback_format=(kept_in,))  # its opset
            each_alone(self.precision_graph(model, made_from).layer_graphs(kept_in), missing, self.batches(model, data),
                       f"layers alone {model}", reference, lambda layer, errors: self.cache.arrays(
                           "layer-errors", parts[layer], lambda: (errors.arrays(), ""), described[layer]),
                       sum(values.nbytes for values in reference.values()), views)

        def read(layer: str, each: QDQ) -> Errors:  # made above: the whole graph only where pruned meanwhile
            return Errors.from_arrays(self.cache.arrays("layer-errors", parts[layer], lambda: (Errors.of(
                reference, self.recipe_semantics(model, each, data), views).arrays(), ""), described[layer])[0])

        return [read(layer, each) for layer, each in zip(layers, alone)]

    def fp32_outputs(self, model: str, data: Data = "evaluation") -> dict[str, np.ndarray]:
        """What a recipe is judged against on ``data``: the reference outputs on the evaluation set, the FP32
        graph's own on the calibration set."""
        evaluation = data == "evaluation"
        return self.reference(model) if evaluation else self.graph_semantics(model, self.fp32_onnx(model), data)

    def coverage(self, model: str, recipe: Recipe) -> dict[str, Any]:
        """Which of ``recipe``'s graph's weighted layers run quantized, and why each float one is float
        (:func:`layer_coverage`, the reasons from the recipe on its FP32 source, or "supplied" for a user's own
        graph), how the graph is quantized (:func:`describe_quantization`) and what evaluates its semantics."""
        import onnx

        path = self.precision_onnx(model, recipe)
        supplied = recipe.name in self.spec(model).quantized

        def read() -> dict[str, Any]:
            graph = onnx.load(str(path))
            source = None if supplied else onnx.load(str(self.recipe_source(model, recipe)))
            return {**recipe_coverage(graph, recipe, source), "graph": describe_quantization(graph),
                    "evaluator": semantics_evaluator(graph)}

        return self._coverage.get(path, lambda: self.cache.json("coverage", [
            file_sha256(path), supplied, recipe.params(),
            source_fingerprint("quantverdict.precision", *SEMANTICS_CODE)], read,
            {"model": model, "precision": recipe.name}))

    def planned_coverage(self, model: str, recipe: Recipe) -> dict[str, Any] | None:
        """:func:`planned_coverage` of ``recipe`` on the model's FP32 graph: what its graph would quantize, known
        before any calibration (None where only making the graph tells); cached."""
        import onnx

        source = self.recipe_source(model, recipe)
        return self.cache.json("planned-coverage", [file_sha256(source), recipe.params(), source_fingerprint(
            "quantverdict.precision")], lambda: planned_coverage(onnx.load(str(source)), recipe),
            {"model": model, "precision": recipe.name})

    def output_kinds(self, model: str) -> dict[str, str]:
        """What each output of the FP32 graph is (:func:`output_kinds`), the model's declared kinds first; cached."""
        import onnx

        path, declared = self.fp32_onnx(model), dict(self.spec(model).output_kinds)
        return self.cache.json("output-kinds", [file_sha256(path), declared, source_fingerprint(
            "quantverdict.judge.output_kinds")], lambda: output_kinds(onnx.load(str(path), load_external_data=False),
                                                                     declared), {"model": model})

    def onnxruntime_cpu_parts(self, *code: str) -> list[Any]:
        return [package_version("onnxruntime"), self.caps.cpu.identity if self.caps.cpu else None,
                source_fingerprint(*code)]

    def for_case(self, model: str, recipe: Recipe, backend: str) -> Artifacts:
        """Lazy handles on what ``backend`` needs for ``model`` in ``recipe`` (finished, for the backend's target)."""
        spec = self.spec(model)
        module = None if spec.build is None else functools.partial(self.module, model)
        ranges_suffice = recipe.ranges_describe_it and recipe.name not in spec.quantized
        return Artifacts(spec, recipe, module, onnx_path=functools.partial(self.precision_onnx, model, recipe),
                         fp32_onnx=functools.partial(self.fp32_onnx, model),
                         ranges=functools.partial(self.ranges, model, recipe) if ranges_suffice else None,
                         calibration_batches=functools.partial(self.calibration_batches, model), cache=self.cache,
                         coverage=functools.partial(self.coverage, model, recipe) if recipe.quantized else None)
