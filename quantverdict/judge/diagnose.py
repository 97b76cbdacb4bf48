"""Where a divergence starts.

``first_divergence`` (the recipe): the FP32 graph and a precision's graph run on the same batch
under ONNX Runtime with every float tensor they share exposed as an output (recipes keep the FP32
graph's tensor names; in parts that fit the memory, the next part read only where the one before
did not diverge: :mod:`quantverdict.precision.exposing`); the first tensor, in the FP32 graph's
topological order, whose cosine similarity falls below the bound is reported with the node and op
that produced it. Constants
(Constant nodes and whatever is computed from initializers alone: shapes, masks) are skipped, and
a tensor whose cosine is undefined (all zeros on one side) is judged by its relative error, so
the report never names a constant or a NaN.

Which overflow of a storage format breaks the output is :mod:`quantverdict.judge.overflow`'s.

Where a runtime leaves a graph's semantics is each backend's own diagnosis (:meth:`Backend.diagnose`;
ONNX Runtime's in :mod:`quantverdict.backends.onnxrt_divergence`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantverdict.judge.compare import cosine, shown_beside, shown_bound
from quantverdict.models.spec import Batch
from quantverdict.precision.exposing import exposure_budget, parts, read
from quantverdict.precision.graph import float_tensors


def input_dependent(graph: onnx.GraphProto) -> set[str]:
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
        summary = f"cosine {shown_beside(similarity, min_cosine)} < {shown_bound(min_cosine)}"
        return not similarity >= min_cosine, {"cosine": similarity, "summary": summary}
    error = float(np.linalg.norm(c - r)) / max(norm_r, norm_c, 1e-300)
    allowed = float(np.sqrt(2 * (1 - min_cosine)))
    side = "FP32" if norm_r == 0 else "the candidate"
    return error > allowed, {"relative_error": error,
                             "summary": f"{side} is all zeros here; relative error {error:.3g} > {allowed:.3g}"}


def first_divergence(fp32_path: Path, candidate_path: Path, batch: Batch, min_cosine: float) -> dict[str, Any] | None:
    reference_graph, candidate_graph = onnx.load(str(fp32_path)), onnx.load(str(candidate_path))
    candidate_names = {o for n in candidate_graph.graph.node for o in n.output}
    floats, live = float_tensors(reference_graph), input_dependent(reference_graph.graph)
    order = [(out, node) for node in reference_graph.graph.node for out in node.output
             if out in floats and out in candidate_names and out in live]
    names = [name for name, _ in order]
    if not names:
        return None
    budget = exposure_budget()  # two graphs' values held at once: half of it each
    for part in parts(reference_graph, names, batch, None if budget is None else budget // 2):
        found = _first_in(order, read(reference_graph, part, batch), read(candidate_graph, part, batch), min_cosine)
        if found is not None:
            return found
    return None


def _first_in(order: list[tuple[str, onnx.NodeProto]], reference: dict[str, np.ndarray],
              candidate: dict[str, np.ndarray], min_cosine: float) -> dict[str, Any] | None:
    """The first tensor read (in graph ``order``) where ``candidate`` leaves ``reference``."""
    for name, node in (entry for entry in order if entry[0] in reference):
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
