"""FP32, TF32, and FP16/BF16 graphs: natively typed for TensorRT, storage-emulated for the CPU.

TensorRT's strongly typed mode takes precision from the graph, so the ``native`` variant
stores weights and every float tensor in the low type, with Casts only at the FP32 model I/O.

ONNX Runtime's CPU provider has no BF16 convolution or matmul kernels (and BF16 ``Conv`` is
not valid ONNX before opset 22), so the CPU graph emulates reduced-precision *storage*: every
float tensor produced (graph inputs, weights, each node's outputs) is rounded through a
``Cast`` to the low type and back. Arithmetic inside an op stays FP32, as on GPU tensor cores
that accumulate in FP32; the FP32 model I/O is kept.
"""
from __future__ import annotations

from typing import Any, Mapping

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantverdict.precision.base import Recipe
from quantverdict.precision.graph import float_tensors, replace_input, topological_sort


def saturate(values: np.ndarray, np_type: object) -> np.ndarray:
    """``values`` in a low float type, out-of-range ones clamped to its largest finite value, as
    TensorRT and ONNX's float16 converters store weights and constants: the large negative number of
    an attention mask (``finfo(float32).min``) stays large and finite, instead of becoming −inf
    (whose product with a zero is NaN)."""
    limit = float(ml_dtypes.finfo(np_type).max)
    return np.clip(values, -limit, limit).astype(np_type)


def round_trip(source: str, target: str, low_type: int, low_name: str) -> list[onnx.NodeProto]:
    """The FP32 tensor ``source`` rounded to ``low_type`` and back, as ``target``: its storage emulated."""
    low = f"{target}__{low_name}_value"
    return [helper.make_node("Cast", [source], [low], to=low_type, name=f"{low}_cast"),
            helper.make_node("Cast", [low], [target], to=TensorProto.FLOAT, name=f"{target}_cast")]


class FP32(Recipe):
    name = "fp32"


class TF32(Recipe):
    """Same graph as FP32; the backend enables TF32 matmul/convolution math."""

    name = "tf32"
    runtime = {"tf32": True}


_LOW = {
    "fp16": (TensorProto.FLOAT16, np.float16),
    "bf16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16),
}


class RoundedStorage(Recipe):
    """Round every float tensor to FP16 or BF16 (see the module docstring)."""

    def __init__(self, name: str):
        self.name = name
        self.onnx_type, self.np_type = _LOW[name]
        self.min_opset = 13 if name == "bf16" else 0  # Cast to bfloat16: opset 13
        self.storage_limit = float(ml_dtypes.finfo(self.np_type).max)  # 65504 for FP16
        self.storage_type = self.onnx_type

    def params(self) -> dict[str, Any]:
        return {**super().params(), "mode": "emulated-storage"}

    def for_target(self, target: str) -> Recipe:
        return NativeLowPrecision(self.name) if target == "native" else self

    def apply_impl(self, model: onnx.ModelProto, ranges: Mapping[str, float]) -> onnx.ModelProto:
        graph = model.graph
        floats = float_tensors(model)
        constants = [*graph.initializer, *(a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                                           if a.type == onnx.AttributeProto.TENSOR)]
        for tensor in constants:
            if tensor.data_type == TensorProto.FLOAT:
                arr = numpy_helper.to_array(tensor)
                tensor.CopyFrom(numpy_helper.from_array(saturate(arr, self.np_type).astype(np.float32), tensor.name))
        new_nodes = []
        for value in graph.input:
            if value.name in floats:
                rounded = f"{value.name}__{self.name}"
                replace_input(graph.node, value.name, rounded)
                new_nodes += round_trip(value.name, rounded, self.onnx_type, self.name)
        for node in list(graph.node):
            for i, name in enumerate(node.output):
                if name in floats:
                    node.output[i] = f"{name}__fp32"
                    new_nodes += round_trip(node.output[i], name, self.onnx_type, self.name)
        graph.node.extend(new_nodes)
        topological_sort(graph)
        return model


# Ops TensorRT has no kernel for in a low type; they run in FP32 between Casts.
# TensorRT-RTX 1.7's parser: "Only FLOAT, HALF or INT8 input is supported for the HardSwish operator".
KEEP_FP32 = {"fp16": frozenset(), "bf16": frozenset({"HardSwish"})}


class NativeLowPrecision(Recipe):
    """The whole graph in FP16/BF16 (weights, constants, internal Casts), FP32 at the model I/O
    and around the ops in :data:`KEEP_FP32`."""

    def __init__(self, name: str):
        self.name = name
        self.onnx_type, self.np_type = _LOW[name]

    def params(self) -> dict[str, Any]:
        return {**super().params(), "mode": "native", "keep_fp32": sorted(KEEP_FP32[self.name])}

    def apply_impl(self, model: onnx.ModelProto, ranges: Mapping[str, float]) -> onnx.ModelProto:
        graph = model.graph
        for init in graph.initializer:
            self._lower_tensor(init)
        for node in graph.node:
            for attr in node.attribute:
                if attr.name == "to" and node.op_type == "Cast" and attr.i == TensorProto.FLOAT:
                    attr.i = self.onnx_type
                elif attr.type == onnx.AttributeProto.TENSOR:
                    self._lower_tensor(attr.t)
        new_nodes = []
        for value in graph.input:
            if value.type.tensor_type.elem_type == TensorProto.FLOAT:
                low = f"{value.name}__{self.name}"
                replace_input(graph.node, value.name, low)
                new_nodes.append(helper.make_node("Cast", [value.name], [low], to=self.onnx_type, name=f"{low}_cast"))
        for value in graph.output:
            if value.type.tensor_type.elem_type == TensorProto.FLOAT:
                low = f"{value.name}__{self.name}"
                for node in graph.node:
                    node.output[:] = [low if out == value.name else out for out in node.output]
                replace_input(graph.node, value.name, low)
                new_nodes.append(helper.make_node("Cast", [low], [value.name], to=TensorProto.FLOAT,
                                                  name=f"{value.name}_cast"))
        for node in [n for n in graph.node if n.op_type in KEEP_FP32[self.name]]:
            new_nodes += self._wrap_in_fp32(node)
        del graph.value_info[:]
        graph.node.extend(new_nodes)
        topological_sort(graph)
        return model

    def _wrap_in_fp32(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        casts = []
        for i, name in enumerate(node.input):
            node.input[i] = f"{name}__fp32_for_{node.name}"
            casts.append(helper.make_node("Cast", [name], [node.input[i]], to=TensorProto.FLOAT,
                                          name=f"{node.input[i]}_cast"))
        for i, name in enumerate(node.output):
            node.output[i] = f"{name}__fp32"
            casts.append(helper.make_node("Cast", [node.output[i]], [name], to=self.onnx_type,
                                          name=f"{name}_cast"))
        return casts

    def _lower_tensor(self, tensor: onnx.TensorProto) -> None:
        if tensor.data_type == TensorProto.FLOAT:
            lowered = saturate(numpy_helper.to_array(tensor), self.np_type)
            tensor.CopyFrom(numpy_helper.from_array(lowered, tensor.name))

FP32_RECIPE, TF32_RECIPE = FP32(), TF32()
FP16_RECIPE, BF16_RECIPE = RoundedStorage("fp16"), RoundedStorage("bf16")
