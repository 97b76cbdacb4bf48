"""Quantizers side by side: the harness's recipes, NVIDIA Model Optimizer's and ONNX Runtime's, on
one model, one calibration set and one evaluation set, each judged on its graph's semantics (Q/DQ
as written) against FP32, and where their Q/DQ placements differ."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import onnx

from quantverdict.errors import interrupted
from quantverdict.judge.by_kind import ByKind
from quantverdict.judge.workbench import Workbench
from quantverdict.judge.output_kinds import measured_output
from quantverdict.judge.tolerances import ToleranceTable
from quantverdict.precision import Recipe, get_recipe
from quantverdict.precision.coverage import quantized_layers
from quantverdict.precision.settings import RecipeSettings


@dataclass
class QuantizerResult:
    label: str
    settings: Mapping[str, Any]
    metrics: dict[str, Any]  # of the first output, by its kind: cosine, snr_db, top1_agreement, detection_f1…
    coverage: dict[str, Any]  # quantized_layers: counts, and the layers by name
    seconds: float  # making the graph (calibration, fallback, quantization); ~0 where it was cached
    error: str = ""  # why this quantizer made no graph (its own failure, in one line); the others still count


def compare_quantizers(store: Workbench, model: str, precision: str, variants: Mapping[str, RecipeSettings],
                       finish: Callable[[Recipe], Recipe], tolerances: ToleranceTable | None = None
                       ) -> tuple[list[QuantizerResult], dict[str, list[str]]]:
    """Each variant (label → recipe settings, e.g. ``RecipeSettings(quantizer="modelopt")``) judged, its recipe
    finished by ``finish`` (the fallback layers it chooses on the calibration set), and the weighted layers not every
    variant quantizes (layer → the labels that do). Each output is judged by what it is, as a case's verdict judges
    it (a detector head by its detections, a CTC output by its text), under ``tolerances`` (the packaged ones)."""
    spec, table = store.spec(model), tolerances or ToleranceTable.load()
    reference, output = store.fp32_outputs(model, "evaluation"), measured_output(store, model)
    judging = ByKind.of(spec, store.output_kinds(model), table, precision,
                        table.resolve(model, precision, spec.tolerances, spec.task))
    results = []
    for label, settings in variants.items():
        start = time.perf_counter()
        try:
            recipe = finish(get_recipe(precision).configured(settings))
            path = store.precision_onnx(model, recipe)
            seconds = time.perf_counter() - start
            judged = judging.compare(reference, store.graph_semantics(model, path), store.undecided(model))
            metrics = judged.metrics[output]
        except Exception as exc:  # a quantizer that fails on this graph (ONNX Runtime's, Model Optimizer's…)
            if interrupted(exc):
                raise KeyboardInterrupt from exc
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            results.append(QuantizerResult(label, settings.to_dict(), {}, {}, time.perf_counter() - start,
                                           f"{type(exc).__name__}: {first}"[:300]))
            continue
        results.append(QuantizerResult(label, settings.to_dict(), metrics, quantized_layers(onnx.load(str(path))),
                                       seconds))
    made = [r for r in results if not r.error]
    every = set().union(*(r.coverage["quantized_layers"] for r in made)) if made else set()
    differences = {layer: [r.label for r in made if layer in r.coverage["quantized_layers"]] for layer in sorted(every)}
    return results, {layer: labels for layer, labels in differences.items() if len(labels) < len(made)}
