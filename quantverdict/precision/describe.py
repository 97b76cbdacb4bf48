"""What a quantized graph is, read off the graph: a user's own graph is recorded as it is, not as the
settings of a recipe that did not make it.

Q/DQ graphs (``QuantizeLinear``/``DequantizeLinear``) and integer-operator graphs (``MatMulInteger``,
``ConvInteger``, ``QLinearMatMul``, ``QLinearConv``, with ``DynamicQuantizeLinear`` for activations
quantized at run time; ONNX Runtime's contrib ones, ``DynamicQuantizeLSTM`` among them, counted) are both read: activations static or dynamic, weights per channel or per
tensor, zero points symmetric or not, and the storage types.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

from quantverdict.precision.coverage import INTEGER_WEIGHT

# For each integer operator: the positions of (activation input, weight input, weight scale, weight zero point)
_INTEGER_INPUTS: dict[str, tuple[int, int, int | None, int | None]] = {
    "MatMulInteger": (0, 1, None, 3), "ConvInteger": (0, 1, None, 3),
    "QLinearMatMul": (0, 3, 4, 5), "QLinearConv": (0, 3, 4, 5)}


def _one_of(values: set[str], none: str) -> str:
    return none if not values else values.pop() if len(values) == 1 else "mixed (" + ", ".join(sorted(values)) + ")"


class _Reader:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.producer = {out: node for node in model.graph.node for out in node.output}

    def constant(self, node: onnx.NodeProto, index: int) -> np.ndarray | None:
        return self.constants.get(node.input[index]) if len(node.input) > index and node.input[index] else None

    def granularity(self, scale: np.ndarray | None, zero_point: np.ndarray | None) -> str:
        sizes = [np.size(value) for value in (scale, zero_point) if value is not None]
        return "per-channel" if any(size > 1 for size in sizes) else "per-tensor"

    def symmetry(self, zero_point: np.ndarray | None) -> str:
        return "symmetric" if zero_point is None or not np.any(zero_point) else "asymmetric"

    def activation(self, node: onnx.NodeProto, index: int) -> str:
        source = self.producer.get(node.input[index])
        return "dynamic" if source is not None and source.op_type == "DynamicQuantizeLinear" else "static"


def describe_quantization(model: onnx.ModelProto) -> dict[str, object]:
    """How ``model`` is quantized: its quantizing operators by count, activations (static: scales stored in
    the graph; dynamic: computed per batch), weight granularity and symmetry, and the storage types."""
    reader = _Reader(model)
    ops: Counter[str] = Counter()
    activations, granularity, weight_symmetry, activation_symmetry, storage = set(), set(), set(), set(), set()
    for node in model.graph.node:
        if node.op_type in _INTEGER_INPUTS:
            ops[node.op_type] += 1
            act, weight, scale, zero = _INTEGER_INPUTS[node.op_type]
            activations.add(reader.activation(node, act))
            weight_values = reader.constant(node, weight)
            if weight_values is not None:
                storage.add(str(weight_values.dtype))
            zero_point = reader.constant(node, zero) if zero is not None else None
            granularity.add(reader.granularity(reader.constant(node, scale) if scale is not None else None, zero_point))
            weight_symmetry.add(reader.symmetry(zero_point))
        elif node.op_type in INTEGER_WEIGHT:  # contrib integer layers (DynamicQuantizeLSTM, QGemm…): counted too
            ops[node.op_type] += 1
            weight_values = reader.constant(node, INTEGER_WEIGHT[node.op_type])
            if weight_values is not None:
                storage.add(str(weight_values.dtype))
        elif node.op_type == "DynamicQuantizeLinear":  # always uint8, zero point chosen per batch
            ops[node.op_type] += 1
            activation_symmetry.add("asymmetric")
            storage.add("uint8")
        elif node.op_type == "DequantizeLinear":
            ops[node.op_type] += 1
            stored, zero_point = reader.constant(node, 0), reader.constant(node, 2)
            if stored is not None:  # a weight stored quantized
                storage.add(str(stored.dtype))
                granularity.add(reader.granularity(reader.constant(node, 1), zero_point))
                weight_symmetry.add(reader.symmetry(zero_point))
        elif node.op_type == "QuantizeLinear":
            ops[node.op_type] += 1
            if reader.constant(node, 0) is None:  # an activation quantized in the graph
                zero_point = reader.constant(node, 2)
                activations.add("static" if reader.constant(node, 1) is not None else "dynamic")
                activation_symmetry.add(reader.symmetry(zero_point))
                if zero_point is not None:
                    storage.add(str(zero_point.dtype))
    return {"operators": dict(sorted(ops.items())), "activations": _one_of(activations, "not quantized"),
            "activation_zero_points": _one_of(activation_symmetry, "none"),
            "weights": _one_of(granularity, "not quantized"), "weight_zero_points": _one_of(weight_symmetry, "none"),
            "storage": sorted(storage)}
