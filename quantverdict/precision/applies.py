"""Whether a recipe's preparation of the graph changes it, read from the graph's structure before anything is
calibrated: SmoothQuant where no MatMul or Gemm takes an activation beside a constant weight of its own (a detector's
or a segmenter's convolutions only), equalization where no convolution feeds a depthwise one, leave the graph as it
is, and a search's candidate made of them would be its base's graph judged again (ddddocr's YOLOX detector: both
SmoothQuant strengths and equalization scored the same to the hundredth of a dB)."""
from __future__ import annotations

import functools
from pathlib import Path

import onnx

from quantverdict.precision.equalize import equalized_activations
from quantverdict.precision.settings import RecipeSettings
from quantverdict.precision.smoothquant import smoothable


def changes_nothing(settings: RecipeSettings, graph: Path) -> str | None:
    """Why ``settings``' preparation (SmoothQuant, equalization) would leave the graph at ``graph`` as it is, or None;
    the graph is read only where ``settings`` prepare it, and once (:func:`_left_as_is`)."""
    asked = [name for name, prepares in (("smoothquant", isinstance(settings.smoothquant, float)),
                                         ("equalize", settings.equalize is True)) if prepares]
    if not asked:
        return None
    stat = graph.stat()
    left = _left_as_is(str(graph), stat.st_mtime_ns, stat.st_size)
    return next((left[name] for name in asked if name in left), None)


@functools.lru_cache(maxsize=16)
def _left_as_is(path: str, modified_ns: int, size: int) -> dict[str, str]:
    """The preparations that leave the graph at ``path`` (as it was at ``modified_ns``, ``size`` bytes) as it is, each
    with why: its structure read once for all of a search's candidates, not once for each."""
    structure = onnx.load(path, load_external_data=False)
    left = {}
    if not smoothable(structure):
        left["smoothquant"] = ("SmoothQuant finds no MatMul or Gemm taking an activation beside a constant weight of "
                               "its own")
    if not equalized_activations(structure):
        left["equalize"] = "equalization finds no convolution feeding a depthwise one"
    return left
