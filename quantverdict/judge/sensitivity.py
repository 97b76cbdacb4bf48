"""Per-layer quantization sensitivity, and accuracy-aware fallback to higher precision.

``store`` is a :class:`~quantverdict.judge.workbench.Workbench` (precision graphs, batches, reference
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

from dataclasses import dataclass

import numpy as np
import onnx

from quantverdict.judge.layer_errors import signal_energy
from quantverdict.judge.workbench import Workbench
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
    return _judged(store, model, store.graph_semantics(model, store.precision_onnx(model, recipe), data), tolerance,
                   data)


def _judged(store: Workbench, model: str, semantics: dict[str, np.ndarray], tolerance: Tolerance,
            data: Data) -> Comparison:
    undecided = store.undecided(model) if data == "evaluation" else None
    return compare(store.fp32_outputs(model, data), semantics, tolerance, store.spec(model).task == "classification",
                   undecided)


def weighted_layers(store: Workbench, model: str, recipe: QDQ) -> list[onnx.NodeProto]:
    """The Conv/Gemm/MatMul layers ``recipe`` quantizes (those fallback may keep in FP32)."""
    graph = onnx.load(str(store.fp32_onnx(model)))
    return [node for node in recipe.quantized_nodes(graph) if node.op_type in WEIGHTED_OPS]


def layer_sensitivity(store: Workbench, model: str, recipe: QDQ,
                      data: Data = "evaluation") -> list[LayerSensitivity]:
    """Most sensitive first (lowest SNR of the first output). The layers quantized alone are made from one
    preparation, calibration and rounding and evaluated in parallel (:meth:`Workbench.layers_alone_errors`), each
    cached as its errors against FP32's outputs, so a rerun reads (the graphs, a copy of the model each, are not
    kept)."""
    output = store.spec(model).outputs[0]
    signal = signal_energy(store.fp32_outputs(model, data)[output])  # once, not for each layer's cosine and SNR
    nodes = weighted_layers(store, model, recipe)
    alone = store.layers_alone_errors(model, recipe, [node.name for node in nodes], data)
    rows = [LayerSensitivity(node.name, node.op_type, errors.cosine(output, signal), errors.snr_db(output, signal))
            for node, errors in zip(nodes, alone)]
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
