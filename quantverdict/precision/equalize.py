"""Activation equalization between convolutions: a per-channel rescaling that keeps the function
and gives the activation between two convolutions the same range in every channel.

Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization") rescales the channels
between ``conv1 → f → conv2`` (``f`` positively homogeneous per channel: ReLU, zero padding, max
pooling): conv1's output channel ``i`` (weights and bias) divided by ``s_i``, conv2's input
channel ``i`` multiplied by it. Nagel et al. choose ``s`` to balance the two layers' *weight*
ranges, which matters for per-tensor weights; with per-output-channel weight scales (what
TensorRT uses, and this harness) that is moot, and the range left unbalanced is the activation's
single per-tensor scale: depthwise networks have activation channels whose ranges differ by orders
of magnitude, and the small ones round to a few levels. So ``s`` here comes from the activation's
calibrated per-channel range ``a``, for pairs whose second convolution is depthwise (one input
channel per output channel): both weight changes are then absorbed by per-channel weight scales,
and ``s_i = a_i / max(a)`` gives every channel the same range for free. Pairs into a dense
convolution are left alone: there the scale lands across its output channels' weights (measured
on EfficientNet-Lite, SmoothQuant's α = 0.5 split cost more than it won).

ReLU6 (``Clip(0, 6)``) is not homogeneous: it becomes ``Min(Relu(x), 6)`` with a per-channel bound
scaled with its channel, which keeps the function exactly (Nagel et al. replace ReLU6 by ReLU,
which changes it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantverdict.precision.base import ChannelRanges
from quantverdict.precision.graph import int_attribute, topological_sort, use_counts
from quantverdict.precision.rescaling import Rescaling

HOMOGENEOUS = {"Relu", "Pad", "MaxPool", "Min"}  # Min only against a per-channel bound this module scales
SCALE_FLOOR = 1e-4  # no channel is scaled up more than 10^4 (dead channels)


@dataclass
class _Pair:
    first: onnx.NodeProto
    second: onnx.NodeProto
    bounds: list[str]  # per-channel Min bounds between them (scaled with the channels)


def equalize(model: onnx.ModelProto, channel_amax: ChannelRanges, rescaling: Rescaling | None = None
             ) -> onnx.ModelProto:
    """``model`` with the activation of every equalizable convolution pair balanced (see above); each activation
    rescaled recorded in ``rescaling``."""
    graph, unsplit = model.graph, model.SerializeToString()
    _split_relu6(graph)
    pairs = _pairs(graph)
    if not pairs:
        return model
    ranges = channel_amax(unsplit, _activations(pairs), 1)  # Min(Relu(x), M) is Clip(x, 0, M): the same values
    tensors = {init.name: init for init in graph.initializer}
    arrays = {name: numpy_helper.to_array(tensors[name]).astype(np.float32) for name in _touched(pairs)}
    for pair in pairs:  # each pair changes only its own activation: ranges of the original graph hold
        scale = _balance(pair, arrays, ranges[pair.second.input[0]])
        if rescaling is not None:
            rescaling.record(pair.second.input[0], pair.second.input[0], 1.0 / scale.astype(np.float64))
    for name, values in arrays.items():
        tensors[name].CopyFrom(numpy_helper.from_array(values, name))
    return model


def equalized_activations(model: onnx.ModelProto) -> list[str]:
    """The activations :func:`equalize` balances in ``model`` (left as it is), whose channel ranges it asks of it."""
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    _split_relu6(graph)
    return _activations(_pairs(graph))


def _activations(pairs: list[_Pair]) -> list[str]:
    return sorted({pair.second.input[0] for pair in pairs})


def _touched(pairs: list[_Pair]) -> set[str]:
    names = set()
    for pair in pairs:
        names.update(pair.first.input[1:3])
        names.add(pair.second.input[1])
        names.update(pair.bounds)
    return names


def _balance(pair: _Pair, arrays: dict[str, np.ndarray], activation: np.ndarray) -> np.ndarray:
    """The pair's weights (and bounds) rescaled in ``arrays``; the scale each channel of its activation is divided
    by."""
    first, second = arrays[pair.first.input[1]], arrays[pair.second.input[1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = activation / activation.max()
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0).clip(SCALE_FLOOR, None).astype(np.float32)
    arrays[pair.first.input[1]] = first / scale.reshape(-1, *[1] * (first.ndim - 1))
    if len(pair.first.input) > 2 and pair.first.input[2]:
        arrays[pair.first.input[2]] = arrays[pair.first.input[2]] / scale
    for bound in pair.bounds:
        arrays[bound] = arrays[bound] / scale.reshape(arrays[bound].shape)
    arrays[pair.second.input[1]] = second * scale.reshape(-1, *[1] * (second.ndim - 1))
    return scale


def _pairs(graph: onnx.GraphProto) -> list[_Pair]:
    """Conv → (homogeneous ops) → depthwise Conv chains in which every intermediate tensor has one
    consumer and both weights are initializers used once."""
    weights = {init.name: list(init.dims) for init in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    consumers = use_counts(graph)
    pairs = []
    for second in graph.node:
        if second.op_type != "Conv" or second.input[1] not in weights or consumers[second.input[1]] != 1:
            continue
        node, bounds = producer.get(second.input[0]), []
        while node is not None and node.op_type in HOMOGENEOUS and consumers[node.output[0]] == 1:
            if node.op_type == "Min":
                if len(node.input) != 2 or node.input[1] not in weights:
                    node = None
                    break
                bounds.append(node.input[1])
            node = producer.get(node.input[0])
        if node is None or node.op_type != "Conv" or consumers[node.output[0]] != 1 or node.input[1] not in weights \
                or consumers[node.input[1]] != 1:
            continue
        channels = weights[node.input[1]][0]
        if int_attribute(second, "group", 1) == channels and weights[second.input[1]][:2] == [channels, 1]:
            pairs.append(_Pair(node, second, bounds))
    return pairs


def _split_relu6(graph: onnx.GraphProto) -> None:
    """Each ``Clip(x, 0, M)`` right after a convolution becomes ``Min(Relu(x), M per channel)``."""
    constants = {init.name: init for init in graph.initializer}  # converted only where a Clip reads one
    constants.update({node.output[0]: a.t for node in graph.node if node.op_type == "Constant"
                      for a in node.attribute if a.name == "value"})
    producer = {out: node for node in graph.node for out in node.output}
    for node in list(graph.node):
        source = producer.get(node.input[0]) if node.input else None
        if node.op_type != "Clip" or source is None or source.op_type != "Conv" or len(node.input) != 3:
            continue
        low, high, weight = (constants.get(name) for name in (*node.input[1:3], source.input[1]))
        if low is None or high is None or weight is None or float(numpy_helper.to_array(low)) != 0.0:
            continue
        high, channels = float(numpy_helper.to_array(high)), weight.dims[0]
        bound = f"{node.output[0]}_channel_bound"
        graph.initializer.append(numpy_helper.from_array(np.full((1, channels, 1, 1), high, np.float32), bound))
        rectified = f"{node.output[0]}_relu"
        graph.node.extend([helper.make_node("Relu", [node.input[0]], [rectified], name=f"{node.name}_Relu"),
                           helper.make_node("Min", [rectified, bound], [node.output[0]], name=f"{node.name}_Min")])
        graph.node.remove(node)
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for node in [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]:
        graph.node.remove(node)  # the Clips' bounds
    topological_sort(graph)
