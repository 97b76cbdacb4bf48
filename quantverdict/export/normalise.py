"""Every graph in one form before any recipe reads it, whoever exported it.

Converters other than torch's write each weight as a ``Constant`` node and no initializers (opset 11/12,
IR 7/8), store weights in FP16 behind a ``Cast``, or behind a ``Transpose``/``Reshape``: a recipe that looks
for weights among the initializers sees none of them and quantizes nothing, and a verdict named INT8 then
describes a float graph. onnx-graphsurgeon's constant folding (what Polygraphy's ``surgeon sanitize
--fold-constants`` runs) evaluates every node that depends on constants alone, with ONNX Runtime, and
writes the results as initializers: the same function, every weight where a recipe looks for it.

Every node gets a name of its own (converters leave them empty or repeat them): recipes keep layers in float
by name, and a verdict names the layers that ran in float.

Inference BatchNormalizations are folded as TensorRT folds them (:mod:`quantverdict.export.batchnorm`): a low-precision
graph must not store a variance TensorRT never stores.

A scalar input the manifest fixes (``value:``, a sample rate) is that constant wherever the graph reads it, so an
``If`` it decides is flattened into the branch that value takes, as any ``If`` whose condition is constant is
(:mod:`quantverdict.export.conditionals`): a network whose weights all live inside such a body is quantized and judged
there, the one branch that runs, not skipped as weights a recipe cannot reach. The input stays declared (fed, read by
nothing).

Quantizing nodes are never folded: a user's ``DequantizeLinear`` of a stored INT8 weight folded into a float
initializer would be a float graph that looks quantized to nobody.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Mapping

import numpy as np
import onnx

from quantverdict.export.batchnorm import fold_batchnorms, foldable_batchnorms
from quantverdict.export.conditionals import flatten_constant_ifs

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

# what folding must leave alone: the nodes that say a tensor is quantized
KEEP = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


def normalised(model: onnx.ModelProto, fixed: Mapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """``model`` with every constant subgraph folded into initializers, the graph inputs named in ``fixed`` read as
    those constants, checked."""
    import onnx_graphsurgeon as gs
    from onnx_graphsurgeon.logger import G_LOGGER

    graph = gs.import_onnx(model)
    for name, value in (fixed or {}).items():
        _read_as_constant(graph, name, gs.Constant(f"{name}__fixed", np.asarray(value)))
    previous, G_LOGGER.severity = G_LOGGER.severity, G_LOGGER.ERROR  # its per-node notes are not the user's
    try:
        # fold_shapes off: a shape an exporter recorded for one batch size must not become the only one
        fold = functools.partial(graph.fold_constants, fold_shapes=False, flatten_subgraphs=False,
                                 should_exclude_node=lambda node: node.op in KEEP)
        fold()
        while flatten_constant_ifs(graph):  # a branch flattened may make more constant
            fold()
        graph.cleanup(remove_unused_graph_inputs=False).toposort()
    finally:
        G_LOGGER.severity = previous
    folded = gs.export_onnx(graph, do_type_check=False)
    fold_batchnorms(folded)
    _name_nodes(folded.graph)
    folded.ir_version = model.ir_version
    folded.producer_name, folded.producer_version = model.producer_name, model.producer_version
    del folded.metadata_props[:]
    folded.metadata_props.extend(model.metadata_props)
    onnx.checker.check_model(folded)
    return folded


def _read_as_constant(graph: "gs.Graph", name: str, constant: "gs.Constant") -> None:
    """Every read of graph input ``name``, in ``graph`` and the bodies of its nodes (which see it from outside),
    made a read of ``constant``."""
    import onnx_graphsurgeon as gs

    for node in graph.nodes:
        node.inputs = [constant if tensor.name == name else tensor for tensor in node.inputs]
        for value in node.attrs.values():
            for body in value if isinstance(value, list) else [value]:
                if isinstance(body, gs.Graph):
                    _read_as_constant(body, name, constant)


def fixed_inputs(model: onnx.ModelProto, values: Mapping[str, tuple[float, str]]) -> dict[str, np.ndarray]:
    """The scalar graph inputs among ``values`` (a manifest's fixed ``value:`` and dtype), each as its 0-d constant."""
    scalar = {value.name for value in model.graph.input
              if value.type.tensor_type.HasField("shape") and not value.type.tensor_type.shape.dim}
    return {name: np.array(value, dtype=dtype) for name, (value, dtype) in values.items() if name in scalar}


def _name_nodes(graph: onnx.GraphProto) -> None:
    """Give every unnamed node, and every node whose name an earlier one took, a name no other node has."""
    taken = {node.name for node in graph.node if node.name}
    seen: set[str] = set()
    for index, node in enumerate(graph.node):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = node.name or f"{node.op_type}_{index}"
        name, suffix = base, 1
        while name in taken or name in seen:
            name, suffix = f"{base}_{suffix}", suffix + 1
        node.name = name
        seen.add(name)


def foldable(model: onnx.ModelProto, fixed: Mapping[str, np.ndarray] | None = None) -> bool:
    """Whether normalising changes ``model``: an input is ``fixed``, a node is a ``Constant``, reads constants only,
    has no name of its own, or is a BatchNormalization to fold."""
    names = [node.name for node in model.graph.node]
    if fixed or not all(names) or len(set(names)) != len(names) or foldable_batchnorms(model):
        return True
    constant = {init.name for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            return True
        inputs = [name for name in node.input if name]
        if inputs and node.op_type not in KEEP and all(name in constant for name in inputs):
            return True
    return False
