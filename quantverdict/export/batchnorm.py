"""BatchNormalization as TensorRT builds it: folded into the Conv before it, else one scale and shift per channel.

TensorRT folds an inference BatchNormalization into the convolution that feeds it (and ONNX Runtime's optimiser
does the same), and turns one it cannot fold into a scale layer whose per-channel scale ``γ/√(var+ε)`` and shift
``β − mean·scale`` it computes in FP32. Its variance and mean never reach a low-precision format by themselves. A
graph that stores them, as other converters write it, judged in FP16 as written would clip a variance of 1e8 to
65,504 and fail a network TensorRT builds correctly: the graph judged must be the one the target builds. Folding
is exact in real arithmetic; in FP32 it moves each output by a rounding or two.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def _inference(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a BatchNormalization in inference mode (one output, no training mode)."""
    training = next((a.i for a in node.attribute if a.name == "training_mode"), 0)
    return node.op_type == "BatchNormalization" and len([o for o in node.output if o]) == 1 and not training


def foldable_batchnorms(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The inference BatchNormalizations whose scale, bias, mean and variance are all initializers."""
    constant = {init.name for init in model.graph.initializer}
    return [node for node in model.graph.node if _inference(node) and all(name in constant for name in node.input[1:5])]


def _epsilon(node: onnx.NodeProto) -> np.float64:
    """The BatchNormalization's epsilon as its runtime adds it (a float32 attribute)."""
    return np.float64(np.float32(next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)))


def _scale_shift(node: onnx.NodeProto, values: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per channel, what ``node`` multiplies by and adds, in float64."""
    gamma, beta, mean, variance = (values[name].astype(np.float64) for name in node.input[1:5])
    scale = gamma / np.sqrt(variance + _epsilon(node))
    return scale, beta - mean * scale


def fold_batchnorms(model: onnx.ModelProto) -> int:
    """Fold ``model``'s BatchNormalizations in place (:func:`foldable_batchnorms`): into a Conv whose output only the
    BatchNormalization reads and whose weights are initializers, else into a BatchNormalization of mean 0 and
    variance 1 that applies the same scale and shift. Returns how many were folded into a Conv."""
    graph = model.graph
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    producer = {out: node for node in graph.node for out in node.output}
    outputs = {value.name for value in graph.output}
    added: list[onnx.TensorProto] = []
    folded = 0
    for node in foldable_batchnorms(model):
        scale, shift = _scale_shift(node, values)
        conv = producer.get(node.input[0])
        weight = conv.input[1] if conv is not None and conv.op_type == "Conv" and len(conv.input) > 1 else None
        if (weight in values and readers.get(node.input[0]) == 1 and node.input[0] not in outputs
                and (len(conv.input) < 3 or not conv.input[2] or conv.input[2] in values)):
            kernel = values[weight].astype(np.float64)
            bias = values[conv.input[2]].astype(np.float64) if len(conv.input) > 2 and conv.input[2] else 0.0
            shape = (-1,) + (1,) * (kernel.ndim - 1)
            names = (f"{conv.name or weight}__folded_weight", f"{conv.name or weight}__folded_bias")
            added += [numpy_helper.from_array((kernel * scale.reshape(shape)).astype(np.float32), names[0]),
                      numpy_helper.from_array((bias * scale + shift).astype(np.float32), names[1])]
            conv.input[1:] = list(names)
            conv.output[0] = node.output[0]
            graph.node.remove(node)
            folded += 1
            continue
        names = [f"{node.name or node.output[0]}__{part}" for part in ("scale", "shift", "mean", "variance")]
        parts = (scale * np.sqrt(1 + _epsilon(node)), shift, np.zeros_like(scale), np.ones_like(scale))
        added += [numpy_helper.from_array(part.astype(np.float32), name) for part, name in zip(parts, names)]
        node.input[1:5] = names
    graph.initializer.extend(added)
    read = {name for node in graph.node for name in node.input}
    for init in [init for init in graph.initializer if init.name not in read and init.name not in outputs]:
        graph.initializer.remove(init)
    return folded
