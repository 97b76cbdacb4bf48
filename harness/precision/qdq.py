"""Explicit quantization: Q/DQ pairs in the layout TensorRT's strongly typed mode expects.

Activations feeding Conv/Gemm/MatMul get one symmetric per-tensor QuantizeLinear →
DequantizeLinear pair (shared by all consumers); weights are stored quantized with a
per-output-channel DequantizeLinear; biases stay float (TensorRT's parser rejects an int32 DQ).
With ``residual_add`` both activation inputs of an Add are quantized too, so TensorRT can fuse
the residual Add into the preceding convolution. ``exclude`` (fnmatch patterns on node names)
keeps layers in high precision; ``only`` quantizes just the named layers (sensitivity analysis).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from typing import Any, Mapping

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness.errors import CalibrationError
from harness.precision.base import Recipe
from harness.precision.calibrators import Calibrator
from harness.precision.graph import float_tensors, initializer_names, replace_input, topological_sort

# op type → indices of inputs that are quantized (activations, or weights when initializers)
QUANTIZED_INPUTS = {"Conv": (0, 1), "Gemm": (0, 1), "MatMul": (0, 1), "Add": (0, 1)}
WEIGHTED_OPS = ("Conv", "Gemm", "MatMul")


@dataclass(frozen=True)
class QuantFormat:
    """A quantized element type and the magnitude its scale maps the calibrated range onto."""

    name: str
    onnx_type: int
    qmax: float
    np_type: Any

    def quantize(self, scaled: np.ndarray) -> np.ndarray:
        """Round values already divided by their scale, as ONNX QuantizeLinear would."""
        clipped = np.clip(scaled, -self.qmax, self.qmax)
        if self.onnx_type == TensorProto.INT8:
            return np.rint(clipped).astype(np.int8)  # rint: half to even, like QuantizeLinear
        return clipped.astype(self.np_type)


INT8 = QuantFormat("int8", TensorProto.INT8, 127.0, np.int8)
FP8_E4M3 = QuantFormat("fp8", TensorProto.FLOAT8E4M3FN, 448.0, ml_dtypes.float8_e4m3fn)


def _weight_axis(node: onnx.NodeProto, rank: int) -> int | None:
    """Output-channel axis of a weight, or None for per-tensor."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return 1 if rank == 2 else None  # MatMul: [in, out]


@dataclass(frozen=True)
class QDQOptions:
    """Which layers a Q/DQ recipe quantizes, and how it calibrates them."""

    calibrator: Calibrator = Calibrator()
    ops: tuple[str, ...] = WEIGHTED_OPS
    residual_add: bool = True
    exclude: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None


class QDQ(Recipe):
    """Post-training quantization to ``fmt`` with calibrated activation ranges."""

    calibrated = True
    quantized = True

    def __init__(self, fmt: QuantFormat, options: QDQOptions | None = None):
        self.fmt = fmt
        self.name = fmt.name
        self.options = options or QDQOptions()

    @property
    def calibrator(self) -> Calibrator:
        return self.options.calibrator

    def with_options(self, **changes: Any) -> "QDQ":
        return QDQ(self.fmt, replace(self.options, **changes))

    def params(self) -> dict[str, Any]:
        opts = self.options
        return {**super().params(), "format": self.fmt.name, "ops": sorted(opts.ops),
                "residual_add": opts.residual_add, "exclude": sorted(opts.exclude),
                "only": None if opts.only is None else sorted(opts.only), "calibration": opts.calibrator.params,
                "weights": "per-channel symmetric", "activations": "per-tensor symmetric"}

    def quantized_nodes(self, model: onnx.ModelProto) -> list[onnx.NodeProto]:
        """The nodes whose inputs this recipe quantizes, after ``ops``/``exclude``/``only``."""
        constant = initializer_names(model) | {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
        floats = float_tensors(model) if self.options.residual_add else set()
        chosen = []
        for node in model.graph.node:
            if node.op_type == "Add":
                if not all(i in floats and i not in constant for i in node.input):
                    continue  # a bias or shape Add (or residual Adds not wanted)
            elif node.op_type not in self.options.ops:
                continue
            if any(fnmatch.fnmatchcase(node.name, pattern) for pattern in self.options.exclude):
                continue
            if self.options.only is not None and node.name not in self.options.only:
                continue
            chosen.append(node)
        return chosen

    def for_target(self, target: str) -> Recipe:
        """INT8 for ONNX Runtime's CPU kernels (the speed lane) is ONNX Runtime's own layout."""
        if target == "onnxruntime-cpu" and self.fmt is INT8:
            from harness.precision.ort_cpu import OrtCpuInt8

            return OrtCpuInt8()
        return self

    def calibration_recipe(self) -> "QDQ":
        return self.with_options(only=None, exclude=())

    def tensors_to_calibrate(self, model: onnx.ModelProto) -> list[str]:
        weights = initializer_names(model)
        seen: dict[str, None] = {}
        for node in self.quantized_nodes(model):
            for index in QUANTIZED_INPUTS[node.op_type]:
                if index < len(node.input) and node.input[index] not in weights:
                    seen[node.input[index]] = None
        return list(seen)

    def apply_impl(self, model: onnx.ModelProto, ranges: Mapping[str, float]) -> onnx.ModelProto:
        graph = model.graph
        missing = [t for t in self.tensors_to_calibrate(model) if t not in ranges]
        if missing:
            raise CalibrationError(f"no calibrated range for tensor(s) {missing[:5]} of graph {graph.name!r}")
        weights = {init.name: init for init in graph.initializer}
        consumers = self.quantized_nodes(model)
        new_nodes: list[onnx.NodeProto] = []
        for tensor in self.tensors_to_calibrate(model):
            new_nodes += self._activation_qdq(graph, tensor, ranges[tensor], consumers)
        quantized_weights: dict[str, str] = {}
        for node in consumers:
            if node.op_type not in WEIGHTED_OPS:
                continue
            name = node.input[1]
            if name in weights and name not in quantized_weights:
                quantized_weights[name] = f"{name}_dequantized"
                new_nodes.append(self._weight_dq(graph, weights[name], _weight_axis(node, len(weights[name].dims))))
            if name in quantized_weights:
                node.input[1] = quantized_weights[name]
        graph.node.extend(new_nodes)
        topological_sort(graph)
        return model

    def _zero_point(self, name: str, count: int | None) -> onnx.TensorProto:
        zeros = np.zeros(count or (), dtype=self.fmt.np_type)
        return numpy_helper.from_array(zeros, name)

    def _activation_qdq(self, graph: onnx.GraphProto, tensor: str, amax: float,
                        consumers: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
        scale = np.float32(max(float(amax), 1e-12) / self.fmt.qmax)
        names = {k: f"{tensor}_{k}" for k in ("scale", "zero_point", "quantized", "dequantized")}
        graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), names["scale"]),
                                  self._zero_point(names["zero_point"], None)])
        replace_input(consumers, tensor, names["dequantized"])
        return [
            helper.make_node("QuantizeLinear", [tensor, names["scale"], names["zero_point"]],
                             [names["quantized"]], name=f"{tensor}_QuantizeLinear"),
            helper.make_node("DequantizeLinear", [names["quantized"], names["scale"], names["zero_point"]],
                             [names["dequantized"]], name=f"{tensor}_DequantizeLinear"),
        ]

    def _weight_dq(self, graph: onnx.GraphProto, weight: onnx.TensorProto, axis: int | None) -> onnx.NodeProto:
        values = numpy_helper.to_array(weight).astype(np.float32)
        if axis is None:
            amax = np.array(np.abs(values).max(), np.float32)
            shape: tuple[int, ...] = ()
        else:
            reduce = tuple(i for i in range(values.ndim) if i != axis)
            amax = np.abs(values).max(axis=reduce).astype(np.float32)
            shape = tuple(1 if i != axis else -1 for i in range(values.ndim))
        scale = (np.maximum(amax, 1e-12) / self.fmt.qmax).astype(np.float32)
        quantized = self.fmt.quantize(values / scale.reshape(shape or ()))
        base = weight.name
        graph.initializer.remove(weight)
        graph.initializer.extend([
            numpy_helper.from_array(quantized, f"{base}_quantized"),
            numpy_helper.from_array(scale, f"{base}_scale"),
            self._zero_point(f"{base}_zero_point", None if axis is None else scale.size),
        ])
        extra = {} if axis is None else {"axis": axis}
        return helper.make_node("DequantizeLinear", [f"{base}_quantized", f"{base}_scale", f"{base}_zero_point"],
                                [f"{base}_dequantized"], name=f"{base}_DequantizeLinear", **extra)
