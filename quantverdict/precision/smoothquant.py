"""SmoothQuant (Xiao et al. 2023): move activation outliers into the weights before quantizing.

A transformer's Linear inputs have a few channels with magnitudes far above the rest; one
per-tensor INT8 scale sized for them rounds every other channel coarsely. For ``y = x W`` the
rewrite ``y = (x / s) (s W)`` is exact in real arithmetic; with ``s_j = amax(x_j)^α /
amax(W_j)^(1−α)`` per input channel ``j`` it balances the two ranges. The graph gets one ``Mul``
by ``1/s`` per smoothed activation (a pointwise op TensorRT fuses into its producer, or that a
deployment folds into a preceding LayerNorm), and the weights of its consumers scaled by ``s``;
the FP32 graph's function is unchanged up to float rounding.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantverdict.precision.base import ChannelRanges
from quantverdict.precision.calibrate import portable
from quantverdict.precision.graph import int_attribute, topological_sort, use_counts
from quantverdict.precision.rescaling import Rescaling

SCALE_LIMITS = (1e-4, 1e4)


def smoothable(model: onnx.ModelProto) -> dict[str, list[tuple[onnx.NodeProto, str, int]]]:
    """Activation tensor → its MatMul/Gemm consumers that take it as the data input with a 2-D
    constant weight used by no other node: (node, weight name, the weight's input-channel axis)."""
    weights = {init.name: init for init in model.graph.initializer}
    uses = use_counts(model.graph)
    groups: dict[str, list[tuple[onnx.NodeProto, str, int]]] = defaultdict(list)
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        data, weight = node.input[0], node.input[1]
        if weight not in weights or len(weights[weight].dims) != 2 or uses[weight] != 1 or data in weights:
            continue
        if int_attribute(node, "transA", 0):
            continue
        groups[data].append((node, weight, int_attribute(node, "transB", 0)))
    return dict(groups)


def smoothing_scale(x_amax: np.ndarray, w_amax: np.ndarray, alpha: float) -> np.ndarray:
    """``s_j = amax(x_j)^α / amax(W_j)^(1−α)``, rounded up to :data:`~quantverdict.precision.calibrate.RANGE_BITS` significant bits (:func:`portable`):
    a power's last bits differ by CPU (numpy's AVX-512 kernels are not the C library's), and ``s`` is written into the
    weights, so unrounded it gave an AVX-512 Xeon a graph of its own for a lock made on an AVX2 EPYC."""
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.power(x_amax, alpha) / np.power(w_amax, 1.0 - alpha)
    return portable(np.where(np.isfinite(scale) & (scale > 0), scale, 1.0).clip(*SCALE_LIMITS)).astype(np.float32)


def smooth(model: onnx.ModelProto, channel_amax: ChannelRanges, alpha: float,
           rescaling: Rescaling | None = None) -> onnx.ModelProto:
    """``model`` with every smoothable activation divided by its per-channel ``s`` and its
    consumers' weights multiplied by it (``channel_amax`` supplies the activations' ranges); each recorded in
    ``rescaling``."""
    graph = model.graph
    groups = smoothable(model)
    if not groups:
        return model
    ranges = channel_amax(model.SerializeToString(), list(groups), -1)
    weights = {init.name: init for init in graph.initializer}
    for tensor, consumers in groups.items():
        matrices = {name: numpy_helper.to_array(weights[name]).astype(np.float32) for _, name, _ in consumers}
        w_amax = np.max([np.abs(matrices[name]).max(axis=1 - axis) for _, name, axis in consumers], axis=0)
        x_amax = ranges[tensor]
        if x_amax.shape != w_amax.shape:
            continue  # the activation's last axis is not the weights' input channels
        scale = smoothing_scale(x_amax, w_amax, alpha)
        smoothed = f"{tensor}_smoothed"
        inverse = numpy_helper.from_array((1.0 / scale).astype(np.float32), f"{tensor}_smooth_inverse_scale")
        graph.initializer.append(inverse)
        graph.node.append(helper.make_node("Mul", [tensor, inverse.name], [smoothed], name=f"{tensor}_Smooth"))
        if rescaling is not None:
            rescaling.record(tensor, smoothed, numpy_helper.to_array(inverse).astype(np.float64))
        for node, name, axis in consumers:
            node.input[0] = smoothed
            shape = (-1, 1) if axis == 0 else (1, -1)
            weights[name].CopyFrom(numpy_helper.from_array(matrices[name] * scale.reshape(shape), name))
    topological_sort(graph)
    return model
