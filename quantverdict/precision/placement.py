"""Where Q/DQ pairs go: the inputs of Conv/Gemm/MatMul a recipe quantizes, the residual input of an Add
TensorRT fuses into a convolution's epilogue (Model Optimizer's placement), the convolutions TensorRT has
a quantized kernel for, each activation's readers, and each weight's output-channel axis."""
from __future__ import annotations

import fnmatch
from typing import Mapping

import numpy as np
import onnx

from quantverdict.precision.coverage import RECURRENT, layers
from quantverdict.precision.graph import initializer_names, int_attribute
from quantverdict.precision.grids import FP8_E4M3, INT8, QuantFormat
from quantverdict.precision.settings import formats_words

# op type → indices of inputs that are quantized (activations, or weights when initializers)
QUANTIZED_INPUTS = {"Conv": (0, 1), "ConvTranspose": (0, 1), "Gemm": (0, 1), "MatMul": (0, 1)}
WEIGHTED_OPS = ("Conv", "Gemm", "MatMul")  # what the weight-rounding techniques (GPTQ, FP4, formats) know
QDQ_OPS = (*WEIGHTED_OPS, "ConvTranspose")  # what the Q/DQ recipes quantize
# What TensorRT fuses into a convolution's epilogue (Model Optimizer's fusible paths: bias, scale,
# batch norm, ReLU, SiLU's Sigmoid and Mul, max pooling), walked back from an Add's input.
EPILOGUE_OPS = {"Add", "Mul", "BatchNormalization", "Relu", "Sigmoid", "MaxPool"}


def tensorrt_quantizes_conv(node: onnx.NodeProto, weight: list[int] | None, fmt: QuantFormat, first: bool) -> bool:
    """Whether TensorRT has a quantized kernel for this convolution in ``fmt``, by Model Optimizer's
    rules (``find_nodes_from_convs_to_exclude``), so the graph quantizes what TensorRT will run
    quantized: input and output channels ≥ 16, except, in INT8, dense square kernels with a channel
    count divisible by 8 (at the graph input or with one side ≥ 16) and grouped ones with output
    channels divisible by 8 and kernels ≥ 3; in FP8, filters of at most 32 taps (so FP8 leaves
    depthwise convolutions in high precision). A weight that is not a constant is not quantized. A transposed
    convolution's weight is [in, out/group, kernel…]."""
    return no_kernel_for_conv(node, weight, fmt, first) is None


def no_kernel_for_conv(node: onnx.NodeProto, weight: list[int] | None, fmt: QuantFormat, first: bool) -> str | None:
    """Why TensorRT has no quantized kernel for this convolution in ``fmt`` (:func:`tensorrt_quantizes_conv`), or
    None where it has one."""
    if weight is None or len(weight) < 3:
        return "its weight is not a constant"
    group = int_attribute(node, "group", 1)
    out_channels, in_channels, kernel = weight[0], weight[1], weight[2:]
    if node.op_type == "ConvTranspose":
        out_channels, in_channels = weight[1] * group, weight[0] // group
    shape = f"{out_channels} output channels, {in_channels} input channels per group, kernel {'×'.join(map(str, kernel))}"
    if not _tensorrt_kernel(out_channels, in_channels, kernel, group, fmt, first):
        return f"TensorRT has no {fmt.name.upper()} kernel for a convolution of {shape}"
    return None


def _tensorrt_kernel(out_channels: int, in_channels: int, kernel: list[int], group: int, fmt: QuantFormat,
                     first: bool) -> bool:
    if out_channels < 16 or in_channels < 16:
        if fmt is not INT8:
            return False
        if group == 1:
            return (out_channels % 8 == 0 or in_channels % 8 == 0) and len(set(kernel)) == 1 and \
                (first or out_channels >= 16 or in_channels >= 16)
        return out_channels % 8 == 0 and min(kernel) >= 3
    return fmt is INT8 or int(np.prod(kernel)) <= 32


def float_reasons(source: onnx.ModelProto, planned: set[str], fmt: QuantFormat, exclude: tuple[str, ...],
                  fallback: Mapping[str, str], only: tuple[str, ...] | None, tensorrt_kernels: bool,
                  offered: tuple[str, ...] = ("fp32",)) -> dict[str, str]:
    """Why each weighted layer of ``source`` that a Q/DQ recipe does not quantize (not in ``planned``) is left in float:
    a pattern the user excluded, fallback (layer → the format it keeps it in, one of those ``offered``; FP32 where that
    is FP8 and TensorRT has no FP8 kernel for the layer), layers analysed alone (``only``), and kinds or shapes no
    runtime has a kernel for in ``fmt``. A layer of a kind the recipe quantizes whose weight is no constant gets no
    reason: it is missed, and a verdict says so."""
    nodes = {node.name: node for node in source.graph.node}
    weights = {init.name: list(init.dims) for init in source.graph.initializer}
    graph_inputs = {value.name for value in source.graph.input}
    name = fmt.name.upper()
    reasons = {}

    def no_kernel(node: onnx.NodeProto, kind: str, in_fmt: QuantFormat) -> str | None:
        """Why TensorRT has no ``in_fmt`` kernel for this convolution (:func:`no_kernel_for_conv`); None for others."""
        if kind in ("Conv", "ConvTranspose") and tensorrt_kernels and weights.get(node.input[1]):
            return no_kernel_for_conv(node, weights[node.input[1]], in_fmt, node.input[0] in graph_inputs)
        return None

    def no_kernel_of_kind(kind: str) -> str | None:
        """Why no runtime runs a layer of ``kind`` in the format, wherever it is (a control-flow body too)."""
        if kind == "LSTM" and fmt.name == "int8":
            return "no kernel: TensorRT runs LSTM in float (no INT8 recurrent kernel takes Q/DQ on its weights); ONNX " \
                   "Runtime runs it in INT8 where the recipe sets recurrent: dynamic (its DynamicQuantizeLSTM)"
        if kind in RECURRENT:
            return f"no kernel: TensorRT and ONNX Runtime run {kind} in float (no {name} recurrent kernel takes Q/DQ " \
                   "on its weights)"
        if kind in ("Einsum", "Attention"):
            return f"no kernel: no {name} {kind} kernel in TensorRT or ONNX Runtime"
        return None

    for layer in layers(source):
        node = nodes.get(layer.name)
        if layer.name in planned or layer.quantized:
            continue
        if node is None:  # inside a control-flow body, which no recipe here enters: missed, unless no kernel anywhere
            if why := no_kernel_of_kind(layer.kind):
                reasons[layer.name] = why
            continue
        pattern = next((p for p in exclude if fnmatch.fnmatchcase(node.name, p)), None)
        if pattern is not None:
            reasons[layer.name] = f"excluded: matches {pattern!r}"
        elif layer.name in fallback:  # an FP8 fallback layer TensorRT has no FP8 kernel for stays FP32
            why = no_kernel(node, layer.kind, FP8_E4M3) if fallback[layer.name] == FP8_E4M3.name else None
            kept = f"FP32, as {why}" if why else fallback[layer.name].upper()
            chosen = "" if len(offered) == 1 else (
                f"; the narrowest of {formats_words(offered).upper()} in which, alone, it costs the output no more than the "
                f"most sensitive layer left in {name} does")
            reasons[layer.name] = f"fallback: in {kept}, among the layers that cost the output most on the " \
                                  f"calibration set{chosen}"
        elif only is not None and layer.name not in only:
            reasons[layer.name] = "excluded: not among the layers analysed (only)"
        elif why := no_kernel_of_kind(layer.kind):
            reasons[layer.name] = why
        else:
            why = no_kernel(node, layer.kind, fmt)
            if why:
                reasons[layer.name] = f"no kernel: {why}"
    return reasons


def activation_readers(plan: list[tuple[onnx.NodeProto, tuple[int, ...]]],
                       weights: set[str]) -> dict[str, list[tuple[onnx.NodeProto, list[int]]]]:
    """Each activation tensor the plan quantizes (in first-read order), with the quantized nodes that
    read it and at which input indices."""
    readers: dict[str, list[tuple[onnx.NodeProto, list[int]]]] = {}
    for node, inputs in plan:
        for index in inputs:
            if index < len(node.input) and node.input[index] not in weights:
                at = readers.setdefault(node.input[index], [])
                if at and at[-1][0] is node:
                    at[-1][1].append(index)
                else:
                    at.append((node, [index]))
    return readers


def residual_inputs(model: onnx.ModelProto) -> dict[str, int]:
    """Residual Adds (by output tensor) and the index of the input to quantize: the one that is not
    the convolution branch. Where both inputs come from different convolutions, the branch is the
    input farther from their nearest common ancestor (the residual skips ahead): Model Optimizer's rule."""
    graph = model.graph
    constant = initializer_names(model) | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    out = {}
    for node in graph.node:
        if node.op_type != "Add" or len(node.input) != 2 or any(i in constant or i not in producer for i in node.input):
            continue
        sources = [producer[i] for i in node.input]
        backbones = [_conv_backbone(graph, source, producer, constant) for source in sources]
        if backbones[0] == backbones[1]:
            continue  # no convolution to fuse into (a transformer's residual stream, a mask), or one branch
        depth = [_ancestors(graph, source, producer) for source in sources]
        if None not in backbones:
            common = set(depth[0]) & set(depth[1])
            lca = min(common, key=lambda i: depth[0][i] + depth[1][i]) if common else None
            branch = 0 if lca is None or depth[0][lca] >= depth[1][lca] else 1
        else:
            branch = 0 if backbones[0] is not None else 1
            if backbones[branch] in depth[1 - branch]:
                continue  # ConvNeXt-like: the other input also starts at that convolution
        out[node.output[0]] = 1 - branch
    return out


def _conv_backbone(graph: onnx.GraphProto, index: int, producer: Mapping[str, int], constant: set[str]) -> int | None:
    """The convolution (node index) whose epilogue node ``index`` would fuse into, walking back
    through :data:`EPILOGUE_OPS` along their one non-constant input (SiLU's Mul along x, not sigmoid(x))."""
    for _ in range(8):
        node = graph.node[index]
        if node.op_type in ("Conv", "ConvTranspose"):
            return index
        if node.op_type not in EPILOGUE_OPS:
            return None
        sources = [producer[i] for i in node.input if i not in constant and i in producer]
        if node.op_type == "Mul" and len(sources) == 2:
            sources = [i for i in sources if graph.node[i].op_type != "Sigmoid"]
        if len(set(sources)) != 1:
            return None
        index = sources[0]
    return None


def _ancestors(graph: onnx.GraphProto, index: int, producer: Mapping[str, int]) -> dict[int, int]:
    """Every node that node ``index`` depends on (and itself), with its shortest distance from it."""
    depth, frontier = {index: 0}, [index]
    while frontier:
        following = []
        for current in frontier:
            for name in graph.node[current].input:
                parent = producer.get(name)
                if parent is not None and parent not in depth:
                    depth[parent] = depth[current] + 1
                    following.append(parent)
        frontier = following
    return depth


def weight_axis(node: onnx.NodeProto, rank: int) -> int | None:
    """Output-channel axis of a weight, or None for per-tensor."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":  # [in, out/group, …]: per output channel only where there is one group
        return 1 if int_attribute(node, "group", 1) == 1 else None
    if node.op_type == "Gemm":
        return 0 if int_attribute(node, "transB", 0) else 1
    return 1 if rank == 2 else None  # MatMul: [in, out]
