"""Whether a recipe's preparation of the graph changes it, read from the graph's structure before anything is
calibrated: SmoothQuant where no MatMul or Gemm takes an activation beside a constant weight of its own (a detector's
or a segmenter's convolutions only), equalization where no convolution feeds a depthwise one, leave the graph as it
is, and a search's candidate made of them would be its base's graph judged again (ddddocr's YOLOX detector: both
SmoothQuant strengths and equalization scored the same to the hundredth of a dB)."""
from __future__ import annotations

from typing import Callable

import onnx

from quantverdict.precision.equalize import equalized_activations
from quantverdict.precision.settings import RecipeSettings
from quantverdict.precision.smoothquant import smoothable


def changes_nothing(settings: RecipeSettings, graph: Callable[[], onnx.ModelProto]) -> str | None:
    """Why ``settings``' preparation (SmoothQuant, equalization) would leave the graph as it is, or None; ``graph``
    loads it (its structure: its weights' data is not read), only where ``settings`` prepare it."""
    smoothing, equalizing = isinstance(settings.smoothquant, float), settings.equalize is True
    if not (smoothing or equalizing):
        return None
    structure = graph()
    if smoothing and not smoothable(structure):
        return "SmoothQuant finds no MatMul or Gemm taking an activation beside a constant weight of its own"
    if equalizing and not equalized_activations(structure):
        return "equalization finds no convolution feeding a depthwise one"
    return None
