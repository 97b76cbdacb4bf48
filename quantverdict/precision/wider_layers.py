"""Layers an INT8 or FP8 recipe keeps out of its format (fallback), in FP16 (or, out of INT8, in FP8) rather than
FP32 where asked.

A layer fallback keeps unquantized costs the deployment its speed, and FP32 costs more of it than FP16: TensorRT
builds a Q/DQ graph with FP16 layers in it (strongly typed: the graph's types say so), and NVIDIA's Model Optimizer
keeps its unquantized layers in FP16. FP16's rounding (11 significant bits) is ~8 bits finer than INT8's grid over a
calibrated range, so the layers it keeps still carry almost none of the quantization noise that fallback removes.

Two forms of one choice, as for the FP16 precision (:mod:`quantverdict.precision.floating`): ``native`` (for
TensorRT) casts the layer's activation inputs to FP16, stores its constants (weight, bias) in FP16, and casts its
output back to FP32; the emulated form (for ONNX Runtime's CPU, and every judgement of the recipe's semantics)
rounds the same tensors through a Cast to FP16 and back and computes in FP32, as tensor cores accumulate in FP32.
Constants beyond FP16's largest finite value are clamped to it (:func:`floating.saturate`); an activation beyond
it becomes infinite in both forms, as it would in the engine, and the recipe's judgement sees it.

An INT8 recipe may keep them in FP8 (E4M3) instead: Q/DQ pairs of that format on the same calibrated ranges, weights
per output channel, as the FP8 recipe places them (:mod:`quantverdict.precision.qdq`). TensorRT builds such mixed
graphs for GPUs with FP8 (compute capability 8.9 and later: Ada, Hopper, Blackwell), where an FP8 layer runs as fast as
an INT8 one; E4M3's 3 significant bits keep an outlier-heavy tensor's small values that one INT8 scale rounds away.
ONNX Runtime's CPU runs the mixed graph only as written (its integer kernels take no float8).

Several formats, narrowest first (``fallback_format: [fp8, fp16, fp32]``), choose one per layer: each layer fallback
keeps goes in the narrowest format in which, alone, it costs the output no more than the most sensitive layer left
in the recipe's own format costs it alone (:func:`quantverdict.tune.fallback.fallback_per_part`): FP8 where E4M3
holds the layer's tensors, FP16 where it does not, FP32 only where FP16 underflows or overflows.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantverdict.errors import CalibrationError
from quantverdict.precision.floating import round_trip, saturate
from quantverdict.precision.graph import topological_sort
from quantverdict.precision.grids import FP8_E4M3, INT8, QuantFormat
from quantverdict.precision.settings import Formats, formats_words, wider_formats



def precisions_needed(precision: str, settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The precisions a GPU must support to run ``precision`` with these recipe settings (or a finished recipe's
    params), each with why: the precision itself, and FP8 where an INT8 recipe may keep fallback layers in it (where
    it chose their formats, where it did)."""
    needed = [(precision, "")]
    setting = "wider_formats" if "wider_formats" in settings else "fallback_format"  # a search's, or the recipe's
    offered = wider_formats(settings.get(setting, "fp32"), setting)
    chosen = settings.get("layer_formats")  # a finished recipe's params: each kept layer's format
    if precision == INT8.name and FP8_E4M3.name in (chosen.values() if isinstance(chosen, Mapping) else offered):
        keeps = "keeps its" if len(offered) == 1 else "may keep"
        needed.append((FP8_E4M3.name, f"{precision} {keeps} fallback layers in FP8 ({setting}: "
                                      f"{formats_words(offered)}): "))
    return needed


def kept_formats(formats: Formats, fmt: QuantFormat) -> tuple[QuantFormat, ...]:
    """The quantized formats a ``fmt`` recipe's fallback may add to its graph: FP8 where an INT8 recipe may keep
    fallback layers in it, else none. FP8 is wider than INT8 only: an FP8 recipe's layers already are."""
    if FP8_E4M3.name not in formats:
        return ()
    if fmt is not INT8:
        raise CalibrationError(f"fallback_format fp8 in the {fmt.name} recipe: only an INT8 recipe keeps layers in FP8 "
                               "(expected fp16 or fp32)")
    return (FP8_E4M3,)


def layers_in_fp16(model: onnx.ModelProto, layers: Sequence[str], native: bool) -> onnx.ModelProto:
    """``model`` with the named nodes computing in FP16 (``native``) or with their inputs and outputs rounded to it."""
    graph = model.graph
    constants = {init.name: init for init in graph.initializer}
    chosen = set(layers)
    rounded: dict[str, str] = {}  # an activation's FP16 form, made once for every layer that reads it
    added: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.name not in chosen:
            continue
        for index, name in enumerate(node.input):
            if not name:
                continue
            if name in constants:
                node.input[index] = _constant_in_fp16(graph, constants[name], node.name, native)
            else:
                if name not in rounded:
                    rounded[name], casts = _cast(name, native)
                    added += casts
                node.input[index] = rounded[name]
        for index, name in enumerate(node.output):
            node.output[index] = f"{name}__{'fp16' if native else 'fp32_wide'}"
            added += _back(node.output[index], name, native)
    graph.node.extend(added)
    read = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
    for name in set(constants) - read:  # read by those layers only: their FP16 copies replace it
        graph.initializer.remove(constants[name])
    topological_sort(graph)
    return model


def _constant_in_fp16(graph: onnx.GraphProto, constant: onnx.TensorProto, layer: str, native: bool) -> str:
    """The layer's own copy of ``constant`` in FP16 (``native``) or rounded to it in FP32: another layer may read it
    in FP32 or quantized."""
    if constant.data_type != TensorProto.FLOAT:
        return constant.name
    low = saturate(numpy_helper.to_array(constant), np.float16)
    name = f"{constant.name}__fp16_for_{layer}"
    graph.initializer.append(numpy_helper.from_array(low if native else low.astype(np.float32), name))
    return name


def _cast(name: str, native: bool) -> tuple[str, list[onnx.NodeProto]]:
    """``name`` in FP16 (native), else rounded to FP16 and back: the tensor the layer reads, and the Casts making it."""
    low = f"{name}__fp16"
    if native:
        return low, [helper.make_node("Cast", [name], [low], to=TensorProto.FLOAT16, name=f"{low}_cast")]
    return low, round_trip(name, low, TensorProto.FLOAT16, "fp16")


def _back(produced: str, name: str, native: bool) -> list[onnx.NodeProto]:
    """The layer's output as the FP32 tensor ``name`` the rest of the graph reads: cast from FP16 (native), else
    rounded to FP16 and back."""
    if native:
        return [helper.make_node("Cast", [produced], [name], to=TensorProto.FLOAT, name=f"{name}_cast")]
    return round_trip(produced, name, TensorProto.FLOAT16, "fp16")
