"""Accuracy-aware fallback: the layers a recipe's ``fallback`` share keeps in a wider format, ranked by how much each,
quantized alone, costs the output on the calibration set, and each one's format among those offered.

``store`` is a :class:`~quantverdict.judge.workbench.Workbench`; every ranking judges the recipe on its graph's
semantics, so a runtime's kernel artefact never moves a layer to FP32.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Sequence

import numpy as np
import onnx

from quantverdict.backends.onnxrt import OnnxRuntimeRunner
from quantverdict.judge.sensitivity import alone_in_formats, layers_alone
from quantverdict.judge.workbench import Workbench
from quantverdict.precision.grids import FP8_E4M3
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.settings import RecipeSettings

# The recipe settings a fallback ranking ignores, and what it ranks with instead: a search's candidates that differ only
# in these read one ranking.
RANKED_AS = RecipeSettings(fallback=None, fallback_format=("fp32",), gptq=False)
# A layer alone in a narrower format (every other layer FP32) quantizes nothing: the calibrator does not move its graph
# either, so candidates that differ in it read one evaluation of each layer.
ALONE_IN_FORMAT = RecipeSettings(calibration="max").over(RANKED_AS)


def choose_fallback(store: Workbench, model: str, recipe: QDQ) -> dict[str, str]:
    """The layers ``recipe``'s ``fallback`` keeps wider, each with its format (:func:`fallback_per_part`): its share of
    the weighted layers (rounded down), the most sensitive ones judged on the calibration set. The share is spent whole,
    as Model Optimizer's AutoQuantize spends its bit budget: agreement on the few calibration samples the recipe was
    fitted to says too little to stop earlier (EfficientNet-Lite0's fully INT8 graph agrees on all 64 of its
    calibration crops, on 95.9% of 512 held-out ones)."""
    return fallback_per_part(store, model, recipe, [np.zeros(0, np.int64)])[0]


def ranking_pass_s(store: Workbench, model: str) -> float:
    """About how long a pass of ``model``'s FP32 graph over its calibration set takes on one thread with ONNX Runtime's
    float optimisations, as each layer quantized alone is ranked (:mod:`quantverdict.judge.layers_alone`): its first
    batch timed (a session made and run once), times the batches."""
    batches = store.batches(model, "calibration")
    started = time.perf_counter()
    with OnnxRuntimeRunner(store.fp32_onnx(model), ["CPUExecutionProvider"], optimize=True, threads=1,
                           quantizers_as_written=True) as runner:
        runner.infer(batches[0])
    return (time.perf_counter() - started) * len(batches)


def layers_kept(share: float | None, layers: int) -> int:
    """How many of ``layers`` a fallback share keeps in FP32: the floor of their product (0.1 of 48 keeps 4)."""
    return math.floor(float(share or 0.0) * layers)


def fallback_per_part(store: Workbench, model: str, recipe: QDQ,
                      held_out: Sequence[np.ndarray]) -> list[dict[str, str]]:
    """For each part of the calibration set ``held_out`` (sample indices), the layers :func:`choose_fallback` keeps
    wider when ranked on the rest of the set, each with its format, so that a recipe search judges fallback on samples
    that did not choose its layers. Each layer quantized alone is evaluated once, on the whole set, and each
    sample's error energy kept: a ranking on any part of the set is then the pooled SNR of that part (calibrated on
    the whole set: a held-out sample still moves a single layer's range, not the ranking's errors).

    The layers are ranked with their weights rounded to nearest, whatever the recipe's rounding: a layer's
    sensitivity is its calibrated ranges' and its weights' grid's, which GPTQ leaves as they are, and a recipe
    search then ranks once for each preparation (its calibrators after fallback judged at those layers), not again
    for each with GPTQ (a ranking evaluates a graph per weighted layer: on a 35M-parameter encoder, as long as ten
    candidates' folds). Ranked with GPTQ's weights, the layers chosen scored within 0.1 dB on held-out samples
    (MiniLM-L6 and a T5-small-sized encoder).

    Where the recipe's ``fallback_format`` offers several (narrowest first), each kept layer's is the narrowest in
    which that layer alone (every other layer FP32) costs the output, pooled on the part's ranking samples, no more
    than the most sensitive layer left in the recipe's own format costs it alone
    (:meth:`~quantverdict.judge.sensitivity.Ranked.formats`), else the widest offered; FP8 only where TensorRT has
    an FP8 kernel for the layer. A layer kept wider then adds no more noise than one the recipe already accepts:
    MiniLM's FFN down-projections, whose inputs' outliers INT8's one scale rounds away, go to FP8, the layers whose
    ranges FP16 underflows to FP32. Each layer alone in each narrower format is evaluated once, on the whole
    calibration set, its graph not kept.

    What the graph and the recipe decide (the layers, their share, the formats each may take) is read before
    anything is evaluated."""
    graph = onnx.load(str(store.fp32_onnx(model)))
    base = recipe.with_settings(RANKED_AS).with_options(fallback_layers=())  # any share, format or rounding: read once
    layers = base.weighted_nodes(graph)
    budget = layers_kept(recipe.options.fallback, len(layers))
    if budget == 0:
        return [{} for _ in held_out]
    offered = recipe.options.fallback_format
    in_format = recipe.with_settings(ALONE_IN_FORMAT).with_options(fallback_layers=(), layer_formats=(), only=())
    fp8_kernels = ({node.name for node in QDQ(FP8_E4M3, replace(in_format.options, only=None)).quantized_nodes(graph)}
                   if FP8_E4M3.name in offered[:-1] else set())  # the layers TensorRT has an FP8 kernel for
    alone = layers_alone(store, model, base, layers, "calibration")
    parts = [alone.ranked(budget, part) for part in held_out]
    wider = [(layer, kept_in) for layer in dict.fromkeys(layer for part in parts for layer in part.kept)
             for kept_in in offered[:-1] if kept_in != FP8_E4M3.name or layer in fp8_kernels]
    noise = alone_in_formats(store, model, in_format, wider, "calibration") if wider else {}
    return [part.formats(offered, noise, alone.signal) for part in parts]
