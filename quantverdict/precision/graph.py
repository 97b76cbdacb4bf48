"""Small ONNX graph edits shared by the recipes."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable

import onnx
from onnx import TensorProto



def float_tensors(model: onnx.ModelProto) -> set[str]:
    """Names of every FLOAT-typed value (graph inputs and node outputs), by shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model)
    values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {v.name for v in values if v.type.tensor_type.elem_type == TensorProto.FLOAT}


def int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    """An integer attribute of ``node`` (``group``, ``transB``, ``axis``…), or its ONNX default."""
    return next((a.i for a in node.attribute if a.name == name), default)


def ints_attribute(node: onnx.NodeProto, name: str, default: list[int]) -> list[int]:
    """An integer-list attribute of ``node`` (``pads``, ``strides``, ``dilations``…), or ``default``."""
    return next((list(a.ints) for a in node.attribute if a.name == name), default)


def use_counts(graph: onnx.GraphProto) -> Counter[str]:
    """How many node inputs read each tensor: a tensor read once can be rescaled with its reader."""
    return Counter(name for node in graph.node for name in node.input)


def initializer_names(model: onnx.ModelProto) -> set[str]:
    return {init.name for init in model.graph.initializer}


def replace_input(nodes: Iterable[onnx.NodeProto], old: str, new: str) -> None:
    for node in nodes:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new


def reads(node: onnx.NodeProto) -> set[str]:
    """What ``node`` reads: its inputs, and the outer tensors its bodies (an If's branches, a Loop's) read."""
    found = set(node.input)
    for attribute in node.attribute:
        for body in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)):
            inner = {init.name for init in body.initializer} | {value.name for value in body.input}
            for inner_node in body.node:
                found.update(name for name in reads(inner_node) if name not in inner)
                inner.update(inner_node.output)
    found.discard("")
    return found


def topological_sort(graph: onnx.GraphProto) -> None:
    """Reorder ``graph.node`` so that every node follows the producers of what it reads (:func:`reads`: an If whose
    branch reads a tensor of the graph follows its producer too)."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    dependents: dict[int, list[int]] = defaultdict(list)
    pending = [0] * len(graph.node)
    for i, node in enumerate(graph.node):
        for name in reads(node):
            if name in producer:
                dependents[producer[name]].append(i)
                pending[i] += 1
    ready = [i for i, count in enumerate(pending) if count == 0]
    order: list[int] = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for j in dependents[i]:
            pending[j] -= 1
            if pending[j] == 0:
                ready.append(j)
    if len(order) != len(graph.node):
        raise ValueError("graph has a cycle")
    nodes = [graph.node[i] for i in order]
    del graph.node[:]
    graph.node.extend(nodes)
