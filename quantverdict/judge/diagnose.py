"""Where a divergence starts.

``first_divergence`` (the recipe): the FP32 graph and a precision's graph run on the same batch
under ONNX Runtime with every float tensor they share exposed as an output (recipes keep the FP32
graph's tensor names); the first tensor, in the FP32 graph's topological order, whose cosine
similarity falls below the bound is reported with the node and op that produced it. Constants
(Constant nodes and whatever is computed from initializers alone: shapes, masks) are skipped, and
a tensor whose cosine is undefined (all zeros on one side) is judged by its relative error, so
the report never names a constant or a NaN.

``first_runtime_divergence`` (a runtime): the same INT8 graph run as written and with ONNX
Runtime's optimisations on, up to each QuantizeLinear in turn; a faithful runtime's codes differ
from the graph's by a step where a value sits near a rounding boundary, so the first quantized
tensor whose codes differ by two steps or more on more than the bound's fraction of elements is
where the runtime's kernels stop computing what the graph says. (In deep random-weight networks
one-step differences compound, so this names the first place to look, not a proof.)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantverdict.export.compat import serialized
from quantverdict.judge.compare import cosine
from quantverdict.models.spec import Batch
from quantverdict.precision.graph import float_tensors


def _run_all(source: Path | onnx.ModelProto, names: list[str], batch: Batch, optimize: bool = False,
             config: dict[str, str] | None = None) -> dict[str, np.ndarray]:
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


def _input_dependent(graph: onnx.GraphProto) -> set[str]:
    """Tensors that depend on a graph input (the rest are constants, whatever computes them)."""
    initializers = {init.name for init in graph.initializer}
    live = {i.name for i in graph.input if i.name not in initializers}
    for node in graph.node:  # topological order
        if node.op_type != "Constant" and any(i in live for i in node.input):
            live.update(node.output)
    return live


def _similarity(r: np.ndarray, c: np.ndarray, min_cosine: float) -> tuple[bool, dict[str, Any]]:
    """(diverged, details): cosine where defined; where one side is all zeros, the relative error
    ‖c − r‖ / max(‖r‖, ‖c‖) against the error that cosine bound allows (√(2(1 − bound)))."""
    norm_r, norm_c = float(np.linalg.norm(r)), float(np.linalg.norm(c))
    if norm_r > 0 and norm_c > 0:
        similarity = cosine(r, c)
        return not similarity >= min_cosine, {"cosine": similarity,
                                              "summary": f"cosine {similarity:.6f} < {min_cosine:g}"}
    error = float(np.linalg.norm(c - r)) / max(norm_r, norm_c, 1e-300)
    allowed = float(np.sqrt(2 * (1 - min_cosine)))
    side = "FP32" if norm_r == 0 else "the candidate"
    return error > allowed, {"relative_error": error,
                             "summary": f"{side} is all zeros here; relative error {error:.3g} > {allowed:.3g}"}


def first_divergence(fp32_path: Path, candidate_path: Path, batch: Batch, min_cosine: float) -> dict[str, Any] | None:
    reference_graph = onnx.load(str(fp32_path))
    candidate_names = {o for n in onnx.load(str(candidate_path)).graph.node for o in n.output}
    floats, live = float_tensors(reference_graph), _input_dependent(reference_graph.graph)
    order = [(out, node) for node in reference_graph.graph.node for out in node.output
             if out in floats and out in candidate_names and out in live]
    names = [name for name, _ in order]
    if not names:
        return None
    reference, candidate = _run_all(fp32_path, names, batch), _run_all(candidate_path, names, batch)
    for name, node in order:
        r, c = reference[name].astype(np.float64).ravel(), candidate[name].astype(np.float64).ravel()
        nonfinite = int(np.count_nonzero(~np.isfinite(c) & np.isfinite(r)))
        if nonfinite:
            return {"tensor": name, "node": node.name, "op": node.op_type, "nonfinite": nonfinite,
                    "bound": min_cosine, "summary": f"{nonfinite} non-finite value(s) where FP32 has finite ones"}
        if np.array_equal(r, c):
            continue
        diverged, details = _similarity(r, c, min_cosine)
        if diverged:
            return {"tensor": name, "node": node.name, "op": node.op_type, "bound": min_cosine, **details}
    return None


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
        written = _run_all(truncated, [node.output[0]], batch)[node.output[0]]
        if written.dtype != np.int8:
            continue
        optimized = _run_all(truncated, [node.output[0]], batch, optimize=True, config=config)[node.output[0]]
        steps = np.abs(written.astype(np.int32) - optimized.astype(np.int32))
        fraction = float(np.mean(steps >= 2))
        if fraction > max_fraction:
            source = producers.get(node.input[0])
            return {"tensor": node.input[0], "node": source.name if source else node.input[0],
                    "op": source.op_type if source else "graph input", "fraction": fraction,
                    "max_steps": int(steps.max())}
    return None
