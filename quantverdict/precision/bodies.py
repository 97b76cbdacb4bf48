"""Weighted layers inside the branches of an ``If``, quantized as the top-level graph's are.

An exporter writes a choice the data makes (a sample rate read at run time, a sequence's length) as an ``If`` whose
branches hold the layers; a recipe that quantizes the top-level graph only leaves every one of them in float. Here each
branch's body gets the Q/DQ pairs the recipe places at the top level (names tagged with the ``If`` and the branch, a
body being a scope of its own), on ranges calibrated in the graph with the ``If`` replaced by that branch (flattened,
as onnx-graphsurgeon flattens an ``If`` whose condition is constant), on the calibration batches whose condition takes
it: the ranges of the data that runs there. A branch no calibration batch takes is calibrated on every batch, routed
through it, so that a verdict on data that takes it judges a quantized branch. ``Loop`` and ``Scan`` bodies (repeated,
their state carried) are not entered: their layers stay in float, and a verdict says so.
"""
from __future__ import annotations

from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from quantverdict.models.spec import Batch

BRANCHES = (("then_branch", True), ("else_branch", False))
Measure = Callable[[bytes, Sequence[str], Sequence[Batch]], Mapping[str, float]]  # (graph, tensors, batches) → amax
Tensors = Callable[[onnx.ModelProto], list[str]]  # the tensors a recipe calibrates in a graph


def branches(model: onnx.ModelProto) -> Iterator[tuple[onnx.NodeProto, str, onnx.GraphProto]]:
    """Each top-level ``If`` of ``model`` with each of its branches: (the node, the attribute, the body)."""
    for node in model.graph.node:
        if node.op_type == "If":
            for attribute in node.attribute:
                if attribute.name in dict(BRANCHES):
                    yield node, attribute.name, attribute.g


def key(node: onnx.NodeProto, attribute: str) -> str:
    """What a branch's ranges and tensor names are tagged with: the ``If`` and the branch."""
    return f"{node.name}/{attribute}"


def as_model(body: onnx.GraphProto, outer: onnx.ModelProto) -> onnx.ModelProto:
    """``body`` as a graph a recipe places Q/DQ in: its nodes and initializers, with the outer graph's initializers and
    inputs beside them (a body reads the weights and inputs of the scope around it)."""
    graph = onnx.GraphProto()
    graph.CopyFrom(body)
    own = {init.name for init in body.initializer}
    graph.initializer.extend(init for init in outer.graph.initializer if init.name not in own)
    graph.input.extend(outer.graph.input)
    return helper.make_model(graph, opset_imports=outer.opset_import, ir_version=outer.ir_version)


def put_back(body: onnx.GraphProto, placed: onnx.ModelProto, outer: onnx.ModelProto) -> None:
    """The body as ``placed`` (:func:`as_model`'s, quantized) has it: its nodes, and the initializers it reads that the
    outer graph does not hold."""
    theirs = {init.name for init in outer.graph.initializer}
    read = {name for node in placed.graph.node for name in node.input}
    del body.node[:]
    body.node.extend(placed.graph.node)
    del body.initializer[:]
    body.initializer.extend(init for init in placed.graph.initializer if init.name in read and init.name not in theirs)
    for opset in placed.opset_import:  # a contrib kernel a body now uses (DynamicQuantizeLSTM)
        if opset.domain not in {each.domain for each in outer.opset_import}:
            outer.opset_import.append(opset)


def flattened(model: onnx.ModelProto, node: onnx.NodeProto, attribute: str) -> onnx.ModelProto:
    """``model`` with ``node`` (a top-level ``If``) replaced by its branch ``attribute``: the body's nodes in its place,
    each of the ``If``'s outputs the body's output of its position."""
    body = next(a.g for a in node.attribute if a.name == attribute)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    at = [index for index, each in enumerate(graph.node) if each.name == node.name and each.op_type == "If"][0]
    inlined = [*body.node, *(helper.make_node("Identity", [inner.name], [outer], name=f"{node.name}/{outer}")
                             for inner, outer in zip(body.output, node.output))]
    nodes = [*graph.node[:at], *inlined, *graph.node[at + 1:]]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(body.initializer)
    return out


def branch_ranges(model: onnx.ModelProto, tensors: Tensors, batches: Sequence[Batch], measure: Measure,
                  conditions: Callable[[bytes, Sequence[str], Sequence[Batch]], list[dict[str, np.ndarray]]]
                  ) -> dict[str, float]:
    """The ranges of the tensors each branch's quantized layers read (``tensors`` of the branch :func:`as_model`), each
    keyed ``<If>/<branch>/<tensor>``, measured on the branch :func:`flattened` over the batches whose condition
    (``conditions``: each batch's values of the named tensors) takes it, or every batch where none does."""
    found = list(branches(model))
    if not found:
        return {}
    names = list(dict.fromkeys(node.input[0] for node, _, _ in found))
    taken = conditions(model.SerializeToString(), names, batches)
    out: dict[str, float] = {}
    for node, attribute, body in found:
        wanted = tensors(as_model(body, model))
        if not wanted:
            continue
        when = dict(BRANCHES)[attribute]
        taking = [batch for batch, values in zip(batches, taken) if bool(values[node.input[0]]) == when]
        taking = taking or list(batches)
        for tensor, amax in measure(flattened(model, node, attribute).SerializeToString(), wanted, taking).items():
            out[f"{key(node, attribute)}/{tensor}"] = amax
    return out


def in_branch(ranges: Mapping[str, float], node: onnx.NodeProto, attribute: str) -> dict[str, float]:
    """The ranges :func:`branch_ranges` measured for one branch, by tensor name."""
    prefix = f"{key(node, attribute)}/"
    return {name[len(prefix):]: amax for name, amax in ranges.items() if name.startswith(prefix)}
