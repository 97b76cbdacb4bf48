"""Each tensor of a graph keyed by what computes it, so that a statistic measured on one graph serves another.

A tensor's values over a batch are a function of the nodes that compute it, their attributes, the initializers they
read and the graph inputs the batch feeds: two graphs that share that subgraph give the tensor the same values, bit for
bit, whatever else differs (ONNX Runtime as written runs each node on its inputs alone). A recipe search prepares many
graphs that differ in a few places: SmoothQuant on a CNN rewrites the one MatMul/Gemm before its classifier, and every
other activation is the unprepared graph's; their histograms need not be measured again
(:func:`quantverdict.precision.calibrate.calibrate`). A tensor whose subgraph holds a node with a graph attribute (an
``If``, a ``Loop``: a body may read outer tensors it does not name) is keyed by its own graph alone.
"""
from __future__ import annotations

import onnx

from quantverdict.hashing import content_hash


def computed_by(model: onnx.ModelProto, scope: str) -> dict[str, str]:
    """Every tensor of ``model``'s main graph → the content key of what computes it; a tensor read from no graph
    input, initializer or node of this graph, or computed through a graph attribute, gets a key of ``scope`` (the
    graph's own content key) and its name, shared with no other graph."""
    graph = model.graph
    keys = {init.name: content_hash("initializer", init.SerializeToString()) for init in graph.initializer}
    for value in graph.input:
        keys.setdefault(value.name, content_hash("input", value.SerializeToString()))
    for node in graph.node:
        inputs = [keys.get(name) if name else "" for name in node.input]
        opaque = None in inputs or any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                       for attribute in node.attribute)
        what = content_hash("node", node.domain, node.op_type,
                            [attribute.SerializeToString() for attribute in node.attribute], inputs)
        for index, name in enumerate(node.output):
            if name:
                keys[name] = content_hash(scope, name) if opaque else content_hash(what, index)
    return keys
