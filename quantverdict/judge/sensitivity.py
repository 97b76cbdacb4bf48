"""Per-layer quantization sensitivity, and accuracy-aware fallback to higher precision.

``store`` is a :class:`~quantverdict.judge.bench.Workbench` (precision graphs, batches, reference
outputs: the run's artifact store); ``data`` names the batches a recipe is judged on: ``"evaluation"`` (the
``sensitivity`` command's diagnosis) or ``"calibration"`` (a recipe's own ``fallback``, chosen on
the data it was fitted to, so the evaluation set stays held out).

Sensitivity: for each weighted layer (Conv/Gemm/MatMul) a Q/DQ recipe would quantize, the model's
output error when only that layer is quantized. Fallback: keep the most sensitive layers in FP32,
one more at a time, until the whole quantized model meets its tolerance (as Intel Neural Compressor
does), or a recipe's share of them (:func:`choose_fallback`). All judge the recipe on its graph's
semantics, so a runtime's kernel artefact never moves a layer to FP32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
import onnx

from quantverdict.judge.bench import Workbench
from quantverdict.judge.compare import Comparison, compare
from quantverdict.judge.tolerances import Tolerance
from quantverdict.models.data import Data
from quantverdict.precision.placement import WEIGHTED_OPS
from quantverdict.precision.qdq import QDQ


@dataclass(frozen=True)
class LayerSensitivity:
    layer: str
    op: str
    cosine: float
    snr_db: float


def evaluate_recipe(store: Workbench, model: str, recipe: QDQ, tolerance: Tolerance,
                    data: Data = "evaluation") -> Comparison:
    """The recipe's graph, evaluated as written (never a runtime's kernels), against FP32 on ``data``."""
    semantics = store.graph_semantics(model, store.precision_onnx(model, recipe), data)
    spec = store.spec(model)
    undecided = store.undecided(model) if data == "evaluation" else None
    return compare(store.fp32_outputs(model, data), semantics, tolerance, spec.task == "classification", undecided)


def weighted_layers(store: Workbench, model: str, recipe: QDQ) -> list[onnx.NodeProto]:
    """The Conv/Gemm/MatMul layers ``recipe`` quantizes (those fallback may keep in FP32)."""
    graph = onnx.load(str(store.fp32_onnx(model)))
    return [node for node in recipe.quantized_nodes(graph) if node.op_type in WEIGHTED_OPS]


def layer_sensitivity(store: Workbench, model: str, recipe: QDQ, progress: bool = True,
                      data: Data = "evaluation") -> list[LayerSensitivity]:
    """Most sensitive first (lowest SNR of the first output). One calibration pass serves every
    layer (:meth:`QDQ.calibration_recipe`) and each layer's evaluation is cached by its graph, so
    a rerun reads; ``progress`` shows a bar on a terminal."""
    from tqdm import tqdm

    output = store.spec(model).outputs[0]
    rows = []
    for node in tqdm(weighted_layers(store, model, recipe), desc=f"sensitivity {model}", unit="layer", leave=False,
                     disable=None if progress else True):
        only = recipe.with_options(only=(node.name,))
        metrics = evaluate_recipe(store, model, only, Tolerance(), data).metrics[output]
        rows.append(LayerSensitivity(node.name, node.op_type, metrics["cosine"], metrics["snr_db"]))
    return sorted(rows, key=lambda row: row.snr_db)


def fallback_until_within(store: Workbench, model: str, recipe: QDQ, tolerance: Tolerance, max_layers: int | None = None,
                          data: Data = "evaluation") -> tuple[QDQ, list[str], Comparison]:
    """The recipe with the fewest most-sensitive layers kept in FP32 (its ``fallback_layers``) that
    meets ``tolerance`` on ``data``.

    Returns the recipe, the layers kept in FP32, and the final comparison (which fails only if
    ``max_layers`` ran out first).
    """
    base = current = recipe.with_options(fallback_layers=())
    kept: list[str] = []
    result = evaluate_recipe(store, model, current, tolerance, data)
    if result.passed or max_layers == 0:  # no ranking needed
        return current, kept, result
    ranking = [row.layer for row in layer_sensitivity(store, model, base, data=data)]
    while not result.passed and ranking and (max_layers is None or len(kept) < max_layers):
        kept.append(ranking.pop(0))
        current = base.with_options(fallback_layers=tuple(kept))
        result = evaluate_recipe(store, model, current, tolerance, data)
    return current, kept, result


def choose_fallback(store: Workbench, model: str, recipe: QDQ) -> list[str]:
    """The layers ``recipe``'s ``fallback`` keeps in FP32: its share of the weighted layers (rounded
    down), the most sensitive ones judged on the calibration set. The share is spent whole, as Model
    Optimizer's AutoQuantize spends its bit budget: agreement on the few calibration samples the
    recipe was fitted to says too little to stop earlier (EfficientNet-Lite0's fully INT8 graph
    agrees on all 64 of its calibration crops, on 95.9% of 512 held-out ones)."""
    base = recipe.with_options(fallback_layers=())
    budget = math.floor(recipe.options.fallback * len(weighted_layers(store, model, base)))
    if budget == 0:
        return []
    return [row.layer for row in layer_sensitivity(store, model, base, data="calibration")[:budget]]
