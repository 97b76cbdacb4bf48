"""FP32, TF32, and FP16/BF16 storage emulation for CPU execution.

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

from harness.precision.base import Recipe
from harness.precision.graph import float_tensors, replace_input, topological_sort


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

    def params(self) -> dict[str, Any]:
        return {**super().params(), "mode": "emulated-storage"}

    def apply_impl(self, model: onnx.ModelProto, ranges: Mapping[str, float]) -> onnx.ModelProto:
        graph = model.graph
        floats = float_tensors(model)
        for init in graph.initializer:
            if init.data_type == TensorProto.FLOAT:
                arr = numpy_helper.to_array(init)
                init.CopyFrom(numpy_helper.from_array(arr.astype(self.np_type).astype(np.float32), init.name))
        new_nodes = []
        for value in graph.input:
            if value.name in floats:
                rounded = f"{value.name}__{self.name}"
                replace_input(graph.node, value.name, rounded)
                new_nodes += self._round_trip(value.name, rounded)
        for node in list(graph.node):
            for i, name in enumerate(node.output):
                if name in floats:
                    node.output[i] = f"{name}__fp32"
                    new_nodes += self._round_trip(node.output[i], name)
        graph.node.extend(new_nodes)
        topological_sort(graph)
        return model

    def _round_trip(self, source: str, target: str) -> list[onnx.NodeProto]:
        low = f"{target}__{self.name}_value"
        return [helper.make_node("Cast", [source], [low], to=self.onnx_type, name=f"{low}_cast"),
                helper.make_node("Cast", [low], [target], to=TensorProto.FLOAT, name=f"{target}_cast")]
