"""Where ONNX Runtime's fused integer kernels leave an INT8 graph's semantics: the same graph run as written
and with optimisations on, up to each QuantizeLinear in turn. A faithful runtime's codes differ from the
graph's by a step where a value sits near a rounding boundary, so the first quantized tensor whose codes
differ by two steps or more on more than the bound's fraction of elements is where the kernels stop
computing what the graph says. (In deep random-weight networks one-step differences compound, so this
names the first place to look, not a proof.)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantverdict.export.compat import serialized
from quantverdict.models.spec import Batch


def run_exposing(source: Path | onnx.ModelProto, names: list[str], batch: Batch, optimize: bool = False,
                 config: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """``names`` (any tensors of the graph, made outputs) over ``batch``, as written or with ONNX Runtime's
    optimisations on (and its session ``config``)."""
    import onnxruntime

    model = onnx.load(str(source)) if isinstance(source, Path) else source
    existing = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in existing)
    options = onnxruntime.SessionOptions()
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    session = onnxruntime.InferenceSession(serialized(model), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, dict(batch))))



def first_runtime_divergence(path: Path, batch: Batch, max_fraction: float,
                             config: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The first INT8 QuantizeLinear whose codes, with optimisations on (and the runtime's session
    ``config``), leave the graph's by ≥ 2 steps on more than ``max_fraction`` of its elements.

    Each candidate is made the only output of the graph, so the optimiser fuses everything before
    it as it does in the whole graph (exposing a tensor in the middle would keep its producer
    unfused); candidates are tried in topological order and the search stops at the first.
    """
    graph = onnx.load(str(path))
    producers = {out: node for node in graph.graph.node for out in node.output}
    for node in graph.graph.node:
        if node.op_type != "QuantizeLinear":
            continue
        truncated = onnx.ModelProto()
        truncated.CopyFrom(graph)
        del truncated.graph.output[:]
        truncated.graph.output.extend([onnx.ValueInfoProto(name=node.output[0])])
        written = run_exposing(truncated, [node.output[0]], batch)[node.output[0]]
        if written.dtype != np.int8:
            continue
        optimized = run_exposing(truncated, [node.output[0]], batch, optimize=True, config=config)[node.output[0]]
        steps = np.abs(written.astype(np.int32) - optimized.astype(np.int32))
        fraction = float(np.mean(steps >= 2))
        if fraction > max_fraction:
            source = producers.get(node.input[0])
            return {"tensor": node.input[0], "node": source.name if source else node.input[0],
                    "op": source.op_type if source else "graph input", "fraction": fraction,
                    "max_steps": int(steps.max())}
    return None
