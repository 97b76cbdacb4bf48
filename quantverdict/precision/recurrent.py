"""LSTM layers in INT8 as ONNX Runtime runs them: its ``DynamicQuantizeLSTM`` (``com.microsoft``).

No runtime takes Q/DQ on a recurrent layer's weights: TensorRT and ONNX Runtime both run such an LSTM in float.
ONNX Runtime has one quantized recurrent kernel, the one its ``quantize_dynamic`` writes: the input and recurrent
weights stored in INT8 (symmetric, one scale per gate row), the input and hidden state quantized by the kernel at each
call. A recipe with ``recurrent: dynamic`` writes that node in the LSTM's place, as ``quantize_dynamic``'s
``LSTMQuant`` does (weights transposed to ``[directions, inputs, 4 × hidden]``), keeping the layer's name; ONNX
defines no such operator, so its graph is judged by ONNX Runtime's kernels, whose integer arithmetic depends on the
CPU's instruction set (:func:`quantverdict.judge.semantics.evaluator` says so). TensorRT's graph keeps it in float.
"""
from __future__ import annotations

from typing import Container, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantverdict.precision.grids import INT8

MS_DOMAIN = "com.microsoft"


def quantizable(node: onnx.NodeProto, constants: Container[str]) -> bool:
    """Whether ``node`` is an LSTM whose input and recurrent weights are constants (what the kernel stores)."""
    return node.op_type == "LSTM" and len(node.input) > 2 and node.input[1] in constants and node.input[2] in constants


def dynamic_lstms(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> None:
    """Each of ``nodes`` (LSTMs of ``model`` with constant weights) replaced by ONNX Runtime's DynamicQuantizeLSTM."""
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    for node in nodes:
        inputs = [node.input[0]]
        scales = []
        for name in node.input[1:3]:  # W [directions, 4·hidden, inputs], R [directions, 4·hidden, hidden]
            values = numpy_helper.to_array(weights[name]).astype(np.float32)
            scale = INT8.scale(np.abs(values).max(axis=2, keepdims=True))  # one per gate row of each direction
            stored = INT8.quantize(values / scale).astype(np.int8).transpose(0, 2, 1)
            graph.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(stored), f"{name}_int8"),
                                      numpy_helper.from_array(scale.reshape(values.shape[:2]), f"{name}_int8_scale"),
                                      numpy_helper.from_array(np.zeros(values.shape[:2], np.int8),
                                                              f"{name}_int8_zero_point")])
            inputs.append(f"{name}_int8")
            scales += [f"{name}_int8_scale", f"{name}_int8_zero_point"]
        inputs += [*node.input[3:8], *[""] * (8 - max(3, len(node.input))), *scales]
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "layout"}
        quantized = helper.make_node("DynamicQuantizeLSTM", inputs, list(node.output), node.name, domain=MS_DOMAIN,
                                     **attributes)
        graph.node.insert(list(graph.node).index(node), quantized)
        graph.node.remove(node)
    read = {name for each in graph.node for name in each.input}
    for name in {name for node in nodes for name in node.input[1:3]} - read:
        graph.initializer.remove(weights[name])
    if nodes and not any(opset.domain == MS_DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
