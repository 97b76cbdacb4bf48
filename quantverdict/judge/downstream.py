"""Graphs that differ from one reference graph in a few nodes, each evaluated from where it differs.

Each layer quantized alone (fallback's ranking, sensitivity) is the prepared FP32 graph with that layer's Q/DQ pairs
and rounded weight. Every node upstream of the difference computes on a batch what the reference computes, so a
layer's graph is evaluated from the cut: one forward pass of the reference gives the values of the tensors the
changed part reads (for a group of layers at once), then only the nodes downstream of the difference run. On a
transformer a layer's downstream is half the network on average.

Every pass runs on one thread with the float nodes' graph optimisations on and the Q/DQ as written
(:func:`~quantverdict.precision.exposing.quantizers_as_written_options`): the CPU's blocked layouts and fused kernels
halve MobileNetV2's ranking, and its outputs are the whole graph's as written up to the float kernels' rounding (a
test holds each layer's error within 90 dB of the signal; measured 104-148 dB), not bit for bit: ONNX Runtime fuses a
residual Add into the convolution before it only where both are in one graph.
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from quantverdict.backends.onnxrt import OnnxRuntimeRunner
from quantverdict.backends.samples import joined
from quantverdict.models.spec import Batch
from quantverdict.precision.exposing import as_written_session, cut_to, with_outputs

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class Downstream:
    """The nodes of a graph from where it differs from its reference on, serialized as a graph of their own."""

    graph: bytes | None  # None where no output of the graph is downstream of the difference
    reads: tuple[str, ...]  # its inputs: the graph's own inputs it reads and the reference's tensors at the cut
    made: tuple[str, ...]  # the graph's outputs it makes
    outputs: tuple[str, ...]  # every output of the graph, in order (those not made are the reference's)


class Reference:
    """The graph every part differs from: what :meth:`part` compares with, and whose values
    :meth:`Group.evaluate` reads at each cut."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.nodes = {node.SerializeToString(deterministic=True) for node in model.graph.node}
        self.initializers = {init.name: init for init in model.graph.initializer}
        self.inputs = tuple(item.name for item in model.graph.input)
        self.types = _tensor_types(model)

    def part(self, changed: onnx.ModelProto) -> Downstream | None:
        """``changed``'s nodes downstream of its difference from the reference; None where that reading does not hold
        (a node with a subgraph reads tensors its inputs do not name; other graph inputs; an output not a node's;
        a value that is no tensor, or local functions)."""
        graph = changed.graph
        outputs = tuple(item.name for item in graph.output)
        made_by_nodes = {name for node in graph.node for name in node.output}
        if (changed.functions or tuple(item.name for item in graph.input) != self.inputs
                or not made_by_nodes.issuperset(outputs)
                or any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for node in graph.node for attribute in node.attribute)):
            return None
        ours = {init.name: init for init in graph.initializer}
        moved = {name for name, init in ours.items() if self.initializers.get(name) != init}  # a message's ==: memcmp
        dirty: set[str] = set()
        kept: list[onnx.NodeProto] = []
        for node in graph.node:  # topologically sorted, as ONNX requires
            if any(name in moved or name in dirty for name in node.input) or \
                    node.SerializeToString(deterministic=True) not in self.nodes:
                dirty.update(node.output)
                kept.append(node)
        needed = [name for node in kept for name in node.input if name and name not in dirty]
        reads = tuple(dict.fromkeys(name for name in needed if name not in ours))
        made = tuple(name for name in outputs if name in dirty)
        if any(name not in self.types for name in reads):
            return None
        if not made:
            return Downstream(None, (), (), outputs)
        used = set(needed)
        model = helper.make_model(helper.make_graph(
            kept, "downstream", [helper.make_tensor_value_info(name, self.types[name], None) for name in reads],
            [onnx.ValueInfoProto(name=name) for name in made], [init for name, init in ours.items() if name in used]),
            opset_imports=changed.opset_import)
        model.ir_version = changed.ir_version
        return Downstream(model.SerializeToString(), reads, made, outputs)

    def runner(self, names: list[str]) -> OnnxRuntimeRunner:
        """A runner of the reference whose outputs are its tensors ``names`` (none of them a graph input), cut to the
        nodes they need: ONNX Runtime runs every node of a graph whichever outputs are fetched, and a group of early
        layers' cuts needs only the start of the network."""
        return _floats_optimised(cut_to(self.model, names).SerializeToString())


@dataclass
class Group:
    """Parts evaluated together: one reference pass per batch for all of them."""

    parts: list[tuple[int, Downstream]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(part.graph or b"") for _, part in self.parts)

    def evaluate(self, reference: Reference, batches: list[Batch], done: Callable[[int, Outputs], object],
                 whole: Callable[[int], object]) -> None:
        """Each part's outputs over ``batches`` on one ONNX Runtime thread, ``done(index, outputs)`` for each: batch by
        batch, the reference's pass then every part's, so that one batch's values at the cuts are held at a time. A
        part ONNX Runtime does not load (its inputs' shapes unknown to a kernel that wants them) is ``whole(index)``'s
        to evaluate: the whole graph, which raises what it raises."""
        loaded: list[tuple[int, Downstream, OnnxRuntimeRunner | None]] = []
        with ExitStack() as stack:
            for index, part in self.parts:
                try:
                    loaded.append((index, part, None if part.graph is None else stack.enter_context(
                        _floats_optimised(part.graph))))
                except Exception:  # noqa: BLE001 - ONNX Runtime's load errors share no base class but Exception
                    whole(index)
            names = list(dict.fromkeys(name for _, part, _ in loaded for name in (*part.reads, *(
                output for output in part.outputs if output not in part.made)) if name not in reference.inputs))
            found: list[list[dict[str, np.ndarray]]] = [[] for _ in loaded]
            theirs = stack.enter_context(reference.runner(names)) if names else None
            for batch in batches:
                values = {**dict(batch), **(theirs.infer(batch) if theirs is not None else {})}
                for held, (_, part, runner) in zip(found, loaded):
                    made = runner.infer({name: values[name] for name in part.reads}) if runner is not None else {}
                    held.append({name: made[name] if name in made else values[name] for name in part.outputs})
        for (index, part, _), held in zip(loaded, found):
            done(index, joined(held, batches))
        self.parts.clear()


def _floats_optimised(graph: bytes) -> OnnxRuntimeRunner:
    """A runner of ``graph``, its float nodes optimised and its Q/DQ as written
    (:func:`~quantverdict.precision.exposing.quantizers_as_written_options`), on one thread, its buffers freed after
    each run: a group holds many at once."""
    return OnnxRuntimeRunner(graph, ["CPUExecutionProvider"], optimize=True, threads=1, pooled=False,
                             quantizers_as_written=True)


def _tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each tensor's element type as ONNX Runtime infers it (every node output marked an output: no pass is run)."""
    types = {item.name: item.type.tensor_type.elem_type for item in model.graph.input}
    names = list(dict.fromkeys(name for node in model.graph.node for name in node.output if name))
    try:
        outputs = as_written_session(with_outputs(model, names), pooled=False).get_outputs()
    except Exception:  # noqa: BLE001 - no type known past the inputs: every part is evaluated whole (Reference.part)
        return types
    for item in outputs:
        if item.type.startswith("tensor(") and hasattr(TensorProto, item.type[7:-1].upper()):
            types[item.name] = getattr(TensorProto, item.type[7:-1].upper())
    return types
