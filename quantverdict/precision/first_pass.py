"""What a recipe search will ask of its unprepared FP32 graph beyond its activations' histograms, measured in the pass
that calibrates it (:mod:`quantverdict.precision.riders`): SmoothQuant's channel ranges of its MatMul and Gemm inputs,
equalization's of its depthwise convolutions' inputs, GPTQ's H of every layer it can round, for every set of the
search (its folds' and the whole calibration set's). Asked one at a time, each was a pass of its own over the
calibration batches, or two (a fold first, then the others): on MobileNetV2's INT8 lock, four passes beside the one.
Every set's H is then held from the first candidate on, not from GPTQ's (265 MB for MobileNetV2, 1.2 GB for the 35M
encoder), within what H may hold (:data:`~quantverdict.precision.hessian.MEASURED_BYTES`).
"""
from __future__ import annotations

from typing import Iterable

import onnx

from quantverdict.hashing import content_hash
from quantverdict.precision.calibrate import ChannelAmax
from quantverdict.precision.equalize import equalized_activations
from quantverdict.precision.gptq import roundable
from quantverdict.precision.hessian import MEASURED_BYTES, MomentSums
from quantverdict.precision.pools import torch_ahead
from quantverdict.precision.riders import Plan, Rider
from quantverdict.precision.settings import RecipeSettings
from quantverdict.precision.smoothquant import smoothable


def planned(settings: Iterable[RecipeSettings]) -> Plan:
    """The riders of the first calibration pass of each graph (a search calibrates one unprepared graph) for what
    the candidates ``settings`` ask of it: SmoothQuant's, equalization's and GPTQ's statistics where one of them uses
    the technique (GPTQ's where every set's H fits :data:`~quantverdict.precision.hessian.MEASURED_BYTES`: torch, which
    H and the rounding use, then begins to load beside the pass; not before a pass runs, as a check that finds every
    candidate's judgement cached needs no torch)."""
    wanted = list(settings)
    smoothing = any(each.smoothquant is not None for each in wanted)
    equalizing = any(each.equalize for each in wanted)
    rounding = any(each.gptq for each in wanted)
    ridden: set[str] = set()

    def plan(model_bytes: bytes, sets: int) -> list[Rider]:
        graph = content_hash(model_bytes)
        if graph in ridden or not (smoothing or equalizing or rounding):
            return []
        ridden.add(graph)
        model = onnx.load_from_string(model_bytes)
        found: list[Rider] = []
        smoothed = list(smoothable(model)) if smoothing else []
        if smoothed:
            found.append(ChannelAmax(model_bytes, smoothed, -1, sets))
        balanced = equalized_activations(model) if equalizing else []
        if balanced:
            found.append(ChannelAmax(model_bytes, balanced, 1, sets))
        layers = list({layer.key: layer for layer in roundable(model)}.values()) if rounding else []  # shared H once
        if layers and sets * sum(layer.hessian_bytes for layer in layers) <= MEASURED_BYTES:
            torch_ahead()
            found.append(MomentSums(model_bytes, layers, sets))
        return found

    return plan
