"""Which 8-bit format suits each tensor a model's recipes quantize: INT8's uniform grid or FP8 E4M3's
relative one, measured as the tensor's own rounding SNR at the scale each format's recipe gives it.

INT8's step is amax/127 wherever a value lies; E4M3's is 1/16 to 1/8 of the value itself (3 mantissa
bits), wherever the scale puts the range. So a tensor whose values fill its range (ReLU6-bounded
activations, most trained weights) rounds finer in INT8 — uniform on [0, a]: 48.1 dB against E4M3's
31.9 dB — and one whose range a few outliers set (a transformer's activations) rounds finer in E4M3,
whose relative step does not care where the outliers put the scale. E4M3's SNR is thus pinned near
32 dB for any tensor inside its normal range, and never below 10·log10(256) = 24.1 dB there (each
error is at most 1/16 of its value). An FP8 recipe that trails INT8 on a network whose tensors round
finer in INT8 pays the format's price, not a recipe defect's; this says which before any search.

Measured on the FP32 graph over the calibration set with each format's calibrator (the model's own
``calibration`` setting), every layer either format's recipe could quantize, so the two formats are
compared tensor by tensor even where TensorRT has no kernel for one of them (``quantized_by`` says).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from quantverdict.cache import Cache
from quantverdict.hashing import file_sha256, source_fingerprint
from quantverdict.judge.workbench import Workbench
from quantverdict.models.spec import Batch
from quantverdict.precision import get_recipe
from quantverdict.precision.calibrate import calibrate, tensor_values
from quantverdict.precision.graph import initializer_names
from quantverdict.precision.grids import QuantFormat, weight_scales
from quantverdict.precision.placement import WEIGHTED_OPS, activation_readers, weight_axis
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.settings import RecipeSettings

PRECISIONS = ("int8", "fp8")


@dataclass(frozen=True)
class TensorFit:
    """One quantized tensor's rounding SNR in each format, at that format's scale."""

    tensor: str
    kind: str  # "activation" (one scale per tensor) or "weight" (one scale per output channel)
    layer: str  # the first quantized layer that reads it
    snr_db: dict[str, float]  # precision → rounding SNR of Q then DQ at its recipe's scale
    quantized_by: list[str]  # the precisions whose recipe puts it in Q/DQ (TensorRT's kernels decide)

    @property
    def finer(self) -> str:
        """The precision whose rounding costs this tensor the least."""
        return max(self.snr_db, key=lambda p: self.snr_db[p])


def rounding_snr(values: np.ndarray, scale: np.ndarray | float, fmt: QuantFormat) -> tuple[float, float]:
    """Signal and noise energy of ``values`` through ``fmt``'s QuantizeLinear → DequantizeLinear at
    ``scale`` (a scalar, or per channel broadcastable against ``values``), in float64."""
    x = values.astype(np.float32, copy=False)
    scale = np.asarray(scale, np.float32)
    restored = fmt.quantize(x / scale).astype(np.float32) * scale
    return float(np.sum(np.square(x, dtype=np.float64))), float(np.sum(np.square(x - restored, dtype=np.float64)))


def snr_db(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def format_recipes(settings: Mapping[str, Mapping[str, Any]]) -> dict[str, QDQ]:
    """INT8 and FP8 recipes with the model's calibration method (its other settings rewrite the graph or
    the weights: not the format's doing), every layer either could quantize."""
    recipes = {}
    for precision in PRECISIONS:
        method = RecipeSettings.known(settings.get(precision) or {}, precision).calibration
        recipe = get_recipe(precision)
        assert isinstance(recipe, QDQ)
        recipes[precision] = recipe.with_settings(RecipeSettings(calibration=method))
    return recipes


def format_fit(store: Workbench, model: str) -> list[TensorFit]:
    """Every activation and weight the INT8 or FP8 recipe quantizes in ``model``, in graph order; cached
    by the FP32 graph, the calibration batches, the recipes and this code."""
    recipes = format_recipes(store.spec(model).recipe)
    fp32 = store.fp32_onnx(model)
    parts = [file_sha256(fp32), store.data_key(model, "calibration"), [r.params() for r in recipes.values()],
             *store.onnxruntime_cpu_parts("quantverdict.judge.formats"), source_fingerprint("quantverdict.precision")]
    rows = store.cache.json("format-fit", parts, lambda: [asdict(fit) for fit in _measure(
        onnx.load(str(fp32)), recipes, store.batches(model, "calibration"), store.cache)], {"model": model})
    return [TensorFit(**row) for row in rows]


def _measure(graph: onnx.ModelProto, recipes: Mapping[str, QDQ], batches: list[Batch], cache: Cache) -> list[TensorFit]:
    weights = initializer_names(graph)
    readers = {p: activation_readers(r.quantized_inputs(graph), weights) for p, r in recipes.items()}
    candidates = activation_readers(_any_kernel(recipes).quantized_inputs(graph), weights)
    tensors = list(candidates)
    if not tensors:
        return list(_weight_fits(graph, recipes))
    graph_bytes = graph.SerializeToString()
    ranges = {p: calibrate(cache, graph_bytes, tensors, batches, r.calibrator) for p, r in recipes.items()}
    scales = {p: {t: recipes[p].fmt.scale(amax) for t, amax in found.items()} for p, found in ranges.items()}
    energy = {(t, p): [0.0, 0.0] for t in tensors for p in recipes}
    for _, values in tensor_values(graph_bytes, tensors, batches):
        for tensor, value in values.items():
            for p, recipe in recipes.items():
                signal, noise = rounding_snr(value, scales[p][tensor], recipe.fmt)
                energy[tensor, p][0] += signal
                energy[tensor, p][1] += noise
    fits = [TensorFit(t, "activation", _label(candidates[t][0][0]), {p: snr_db(*energy[t, p]) for p in recipes},
                      [p for p in recipes if t in readers[p]]) for t in tensors]
    return fits + list(_weight_fits(graph, recipes))


def _any_kernel(recipes: Mapping[str, QDQ]) -> QDQ:
    """A recipe that quantizes every layer either format could, whether or not TensorRT has its kernel."""
    return recipes[PRECISIONS[0]].with_options(tensorrt_kernels=False)


def _weight_fits(graph: onnx.ModelProto, recipes: Mapping[str, QDQ]) -> Iterable[TensorFit]:
    """Each constant weight of a layer either recipe could quantize, per-channel scaled as the recipes store it."""
    initializers = {init.name: init for init in graph.graph.initializer}
    quantized = {p: {n.output[0] for n in r.quantized_nodes(graph)} for p, r in recipes.items()}
    seen = set()
    for node in _any_kernel(recipes).quantized_nodes(graph):
        if node.op_type not in WEIGHTED_OPS or node.input[1] not in initializers or node.input[1] in seen:
            continue
        seen.add(node.input[1])
        values = numpy_helper.to_array(initializers[node.input[1]]).astype(np.float32)
        axis = weight_axis(node, values.ndim)
        snr = {p: snr_db(*rounding_snr(values, weight_scales(values, axis, r.fmt), r.fmt)) for p, r in recipes.items()}
        by = [p for p in recipes if node.output[0] in quantized[p]]
        yield TensorFit(node.input[1], "weight", _label(node), snr, by)


def _label(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


WORST = 5  # tensors listed per format: the few that decide a network's verdict, which a median hides


def summarize(fits: list[TensorFit]) -> dict[str, dict[str, Any]]:
    """Per kind: how many tensors, how many round finer in each precision, the median SNR of each and of
    INT8's lead over FP8 (negative where FP8 leads), and each format's worst tensors: a few GELU or FFN
    outputs rounding at 8 dB in INT8 decide more than the median of every tensor at 32 dB."""
    summary = {}
    for kind in ("activation", "weight"):
        rows = [f for f in fits if f.kind == kind and all(math.isfinite(v) for v in f.snr_db.values())]
        if not rows:
            continue
        summary[kind] = {"tensors": len(rows), "finer": {p: sum(f.finer == p for f in rows) for p in PRECISIONS},
                         "median_snr_db": {p: float(np.median([f.snr_db[p] for f in rows])) for p in PRECISIONS},
                         "median_int8_lead_db": float(np.median([f.snr_db["int8"] - f.snr_db["fp8"] for f in rows])),
                         "worst": {p: [{"tensor": f.tensor, "layer": f.layer, "snr_db": f.snr_db}
                                       for f in sorted(rows, key=lambda f: f.snr_db[p])[:WORST]] for p in PRECISIONS}}
    return summary
