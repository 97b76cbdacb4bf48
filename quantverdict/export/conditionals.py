"""An ``If`` whose condition is a constant replaced by the branch it takes, every output of it.

onnx-graphsurgeon's ``fold_constants`` flattens such an ``If`` too, but through 0.6.1 it rebinds the first output
only: it clears each output's producer while iterating over the node's outputs, which that clearing shortens. A
trained voice detector (silero-vad's ``silero_vad.onnx``: its probability and its recurrent state from one ``If``
on the sample rate) lost its state's producer, and the graph failed ONNX's checker. Bodies are flattened before the
graph that holds them, as graphsurgeon does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs


def flatten_constant_ifs(graph: "gs.Graph") -> bool:
    """Replace, in ``graph`` and the bodies of its nodes, each ``If`` whose condition is a constant by the nodes of
    the branch it takes; whether any was."""
    import onnx_graphsurgeon as gs

    changed = False
    for node in graph.nodes:
        for body in _bodies(node):
            changed |= flatten_constant_ifs(body)
    index = 0
    while index < len(graph.nodes):
        node = graph.nodes[index]
        if node.op != "If" or not isinstance(node.inputs[0], gs.Constant):
            index += 1
            continue
        branch = node.attrs["then_branch" if bool(np.asarray(node.inputs[0].values).item()) else "else_branch"]
        for tensor in branch._local_tensors().values():  # its names, apart from the graph's
            if isinstance(tensor, gs.Constant):  # its own values: exporting renames the proto they are read from
                tensor.values = np.array(tensor.values)
            tensor.name += f"__{node.name or 'If'}_{index}"
        inside, bridges, given = {id(made) for made in branch.nodes}, [], {}
        for outer, inner in zip(list(node.outputs), list(branch.outputs)):
            outer.inputs.clear()
            producer = next((made for made in inner.inputs if id(made) in inside), None)
            if producer is not None and not inner.outputs and id(inner) not in given:
                producer.outputs[[id(tensor) for tensor in producer.outputs].index(id(inner))] = outer
            else:  # read inside the branch too, a constant, or a tensor of the graph around it: passed through
                bridges.append(gs.Node("Identity", f"{outer.name}__passed", inputs=[given.get(id(inner), inner)],
                                       outputs=[outer]))
            given[id(inner)] = outer
        graph.nodes[index:index + 1] = [*branch.nodes, *bridges]
        index += len(branch.nodes) + len(bridges)
        changed = True
    return changed


def _bodies(node: "gs.Node") -> Iterator["gs.Graph"]:
    import onnx_graphsurgeon as gs

    for value in node.attrs.values():
        yield from (body for body in (value if isinstance(value, list) else [value]) if isinstance(body, gs.Graph))
