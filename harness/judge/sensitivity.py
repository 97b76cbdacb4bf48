"""Per-layer quantization sensitivity, and accuracy-aware fallback to higher precision.

``store`` is the run's :class:`harness.run.artifacts.ArtifactStore` (precision graphs, batches,
reference outputs).

Sensitivity: for each layer a Q/DQ recipe would quantize, the model's output error when only
that layer is quantized. Fallback: keep the most sensitive layers in FP32, one more at a time,
until the whole quantized model meets its tolerance (as Intel Neural Compressor does). Both judge
the recipe on its graph's semantics, so a runtime's kernel artefact never moves a layer to FP32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx

from harness.judge.compare import Comparison, compare
from harness.judge.tolerances import Tolerance
from harness.precision.qdq import QDQ


@dataclass(frozen=True)
class LayerSensitivity:
    layer: str
    op: str
    cosine: float
    snr_db: float


def evaluate_recipe(store: Any, model: str, recipe: QDQ, tolerance: Tolerance) -> Comparison:
    """The recipe's graph, evaluated as written (never a runtime's kernels), against FP32."""
    semantics = store.graph_semantics(model, store.precision_onnx(model, recipe))
    spec = store.models.get(model)
    return compare(store.reference(model), semantics, tolerance, spec.task == "classification")


def layer_sensitivity(store: Any, model: str, recipe: QDQ, progress: bool = True) -> list[LayerSensitivity]:
    """Most sensitive first (lowest SNR of the first output). One calibration pass serves every
    layer (:meth:`QDQ.calibration_recipe`) and each layer's evaluation is cached by its graph, so
    a rerun reads; ``progress`` shows a bar on a terminal."""
    from tqdm import tqdm

    graph = onnx.load(str(store.fp32_onnx(model)))
    output = store.models.get(model).outputs[0]
    rows = []
    for node in tqdm(recipe.quantized_nodes(graph), desc=f"sensitivity {model}", unit="layer", leave=False,
                     disable=None if progress else True):
        metrics = evaluate_recipe(store, model, recipe.with_options(only=(node.name,)), Tolerance()).metrics[output]
        rows.append(LayerSensitivity(node.name, node.op_type, metrics["cosine"], metrics["snr_db"]))
    return sorted(rows, key=lambda row: row.snr_db)


def fallback_until_within(store: Any, model: str, recipe: QDQ, tolerance: Tolerance,
                          max_layers: int | None = None) -> tuple[QDQ, list[str], Comparison]:
    """The recipe with the fewest most-sensitive layers kept in FP32 that meets ``tolerance``.

    Returns the recipe, the layers kept in FP32, and the final comparison (which fails only if
    ``max_layers`` ran out first).
    """
    ranking = [row.layer for row in layer_sensitivity(store, model, recipe)]
    kept: list[str] = []
    current = recipe
    result = evaluate_recipe(store, model, current, tolerance)
    while not result.passed and ranking and (max_layers is None or len(kept) < max_layers):
        kept.append(ranking.pop(0))
        current = recipe.with_options(exclude=(*recipe.options.exclude, *kept))
        result = evaluate_recipe(store, model, current, tolerance)
    return current, kept, result
