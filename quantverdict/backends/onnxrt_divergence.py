"""Where ONNX Runtime's fused integer kernels leave an INT8 graph's semantics: the same graph run as written
and with optimisations on, up to each QuantizeLinear in turn. A faithful runtime's codes differ from the
graph's by a step where a value sits near a rounding boundary, so the first quantized tensor whose codes
differ by two steps or more on more than the bound's fraction of elements is where the kernels stop
computing what the graph says. (In deep random-weight networks one-step differences compound, so this
names the first place to look, not a proof.)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from quantverdict.backends.base import Runner
from quantverdict.export.compat import serialized
from quantverdict.models.spec import Batch
from quantverdict.precision.exposing import exposed, with_outputs


def first_runtime_divergence(path: Path, batch: Batch, max_fraction: float,
                             optimized: Callable[[bytes], Runner]) -> dict[str, Any] | None:
    """The first INT8 QuantizeLinear whose codes, with optimisations on (a graph's bytes run by ``optimized``'s
    runner, as the backend runs it), leave the graph's by ≥ 2 steps on more than ``max_fraction`` of its elements.

    The graph's codes are read as written, every quantizer's in one pass (:func:`exposed`, in parts that fit the
    memory: nothing is fused there, so exposing a tensor changes no value). With optimisations on, each candidate is
    made the only output of the graph, so the optimiser fuses everything before it as it does in the whole graph
    (exposing a tensor in the middle would keep its producer unfused); candidates are tried in topological order and
    the search stops at the first.
    """
    graph = onnx.load(str(path))
    producers = {out: node for node in graph.graph.node for out in node.output}
    quantizers = {node.output[0]: node for node in graph.graph.node if node.op_type == "QuantizeLinear"}
    for _, written in exposed(graph, list(quantizers), [batch]):
        for name, codes in written.items():
            if codes.dtype != np.int8:
                continue
            steps = np.abs(codes.astype(np.int32) - _up_to(graph, name, batch, optimized).astype(np.int32))
            fraction = float(np.mean(steps >= 2))
            if fraction > max_fraction:
                tensor = quantizers[name].input[0]
                source = producers.get(tensor)
                return {"tensor": tensor, "node": source.name if source else tensor,
                        "op": source.op_type if source else "graph input", "fraction": fraction,
                        "max_steps": int(steps.max())}
    return None


def _up_to(graph: onnx.ModelProto, name: str, batch: Batch, optimized: Callable[[bytes], Runner]) -> np.ndarray:
    """The tensor ``name`` over ``batch`` from ``graph`` with it as the only output, run by ``optimized``'s runner."""
    with optimized(serialized(with_outputs(graph, [name]))) as runner:
        return runner.infer(batch)[name]
