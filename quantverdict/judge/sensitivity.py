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

import functools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx

from quantverdict.judge.layer_errors import Errors, per_sample, pooled_snr, views_of, whole
from quantverdict.judge.workbench import Workbench
from quantverdict.judge.compare import Comparison, compare
from quantverdict.judge.output_kinds import measured_output
from quantverdict.judge.tolerances import Tolerance
from quantverdict.models.data import Data
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
    return recipe.weighted_nodes(onnx.load(str(store.fp32_onnx(model))))


@dataclass(frozen=True)
class Ranked:
    """The layers most sensitive on the samples ``ranked_on`` (a mask), most sensitive first, and the pooled SNR there
    of the most sensitive layer left out, alone (infinite where none is)."""

    kept: list[str]
    worst_left: float
    ranked_on: np.ndarray

    def formats(self, offered: Sequence[str], noise: Mapping[tuple[str, str], np.ndarray],
                signal: np.ndarray) -> dict[str, str]:
        """Each kept layer's format: the narrowest of ``offered`` (narrowest first) in which that layer alone costs the
        output, pooled on the ranking's samples, no more than the most sensitive layer left out costs it alone, else
        the widest. ``noise`` holds each (layer, narrower format) evaluated alone, per sample; one not there is not
        offered to that layer."""
        return {layer: next((kept_in for kept_in in offered[:-1] if (layer, kept_in) in noise and pooled_snr(
            signal, noise[layer, kept_in][None], self.ranked_on)[0] >= self.worst_left), offered[-1])
                for layer in self.kept}


@dataclass(frozen=True)
class LayersAlone:
    """``layers``, each quantized alone (every other layer FP32), as its outputs' :class:`Errors` against FP32's, and
    each sample's energy of FP32's ``output`` (``signal``; the one :func:`~quantverdict.judge.output_kinds.measured`):
    a ranking on any part of the samples is read from these (its error energies, ``noise``: a row per layer), with no
    graph evaluated again."""

    layers: Sequence[onnx.NodeProto]
    output: str
    signal: np.ndarray
    errors: Sequence[Errors]

    @functools.cached_property
    def noise(self) -> np.ndarray:
        return np.stack([errors.noise(self.output) for errors in self.errors])

    def ranked(self, count: int, left_out: np.ndarray) -> Ranked:
        """The ``count`` layers whose pooled SNR is lowest on every sample but those ``left_out`` (indices)."""
        ranked_on = np.ones(len(self.signal), bool)
        ranked_on[left_out] = False
        snr = pooled_snr(self.signal, self.noise, ranked_on)
        order = np.argsort(snr, kind="stable")
        worst_left = float(snr[order[count]]) if count < len(self.layers) else math.inf
        return Ranked([self.layers[i].name for i in order[:count]], worst_left, ranked_on)


def layers_alone(store: Workbench, model: str, recipe: QDQ, layers: Sequence[onnx.NodeProto],
                 data: Data) -> LayersAlone:
    """``layers`` of ``recipe`` quantized alone, evaluated on ``data`` (:meth:`Workbench.layers_alone_errors`)."""
    output, reference = measured_output(store, model), store.fp32_outputs(model, data)
    viewed = views_of(store.spec(model).detections, reference).get(output, whole)  # as the layers' errors are taken
    signal = np.sum(per_sample(viewed(reference[output])) ** 2, 1)
    return LayersAlone(layers, output, signal, store.layers_alone_errors(model, recipe, [node.name for node in layers],
                                                                         data))


def alone_in_formats(store: Workbench, model: str, recipe: QDQ, layers: Sequence[tuple[str, str]],
                     data: Data) -> dict[tuple[str, str], np.ndarray]:
    """Each (layer, format) of ``layers`` as each sample's error energy on the measured output with that layer alone
    kept in that format and every other one FP32 (``recipe`` quantizes none: its fallback and formats emptied), the
    layers of one format made together and evaluated from each one's cut (:meth:`Workbench.layers_alone_errors`)."""
    output = measured_output(store, model)
    noise = {}
    for kept_in in dict.fromkeys(kept_in for _, kept_in in layers):
        names = [layer for layer, wider in layers if wider == kept_in]
        for layer, errors in zip(names, store.layers_alone_errors(model, recipe, names, data, kept_in)):
            noise[layer, kept_in] = errors.noise(output)
    return noise


def layer_sensitivity(store: Workbench, model: str, recipe: QDQ,
                      data: Data = "evaluation") -> list[LayerSensitivity]:
    """Most sensitive first (lowest SNR of the measured output). The layers quantized alone are made from one
    preparation, calibration and rounding and evaluated in parallel (:meth:`Workbench.layers_alone_errors`), each
    cached as its errors against FP32's outputs, so a rerun reads (the graphs, a copy of the model each, are not
    kept)."""
    alone = layers_alone(store, model, recipe, weighted_layers(store, model, recipe), data)
    signal = float(np.sum(alone.signal))  # once, not for each layer's cosine and SNR
    rows = [LayerSensitivity(node.name, node.op_type, errors.cosine(alone.output, signal),
                             errors.snr_db(alone.output, signal)) for node, errors in zip(alone.layers, alone.errors)]
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
