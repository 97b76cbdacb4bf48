"""Find the first layer whose output diverges between the FP32 graph and a precision's graph.

Both graphs are run on the same batch under ONNX Runtime with every float tensor they share
exposed as an output (recipes keep the FP32 graph's tensor names); the first tensor, in the
FP32 graph's topological order, whose cosine similarity falls below the bound is reported with
the node and op that produced it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from harness.models.spec import Batch
from harness.precision.graph import float_tensors


def _run_all(path: Path, names: list[str], batch: Batch) -> dict[str, np.ndarray]:
    import onnxruntime

    model = onnx.load(str(path))
    existing = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in existing)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, dict(batch))))


def first_divergence(fp32_path: Path, candidate_path: Path, batch: Batch, min_cosine: float) -> dict[str, Any] | None:
    reference_graph = onnx.load(str(fp32_path))
    candidate_names = {o for n in onnx.load(str(candidate_path)).graph.node for o in n.output}
    floats = float_tensors(reference_graph)
    order = [(out, node) for node in reference_graph.graph.node for out in node.output
             if out in floats and out in candidate_names]
    names = [name for name, _ in order]
    if not names:
        return None
    reference, candidate = _run_all(fp32_path, names, batch), _run_all(candidate_path, names, batch)
    for name, node in order:
        r, c = reference[name].astype(np.float64).ravel(), candidate[name].astype(np.float64).ravel()
        denom = np.linalg.norm(r) * np.linalg.norm(c)
        cosine = float(np.dot(r, c) / denom) if denom > 0 else float(np.array_equal(r, c))
        if not cosine >= min_cosine:
            return {"tensor": name, "node": node.name, "op": node.op_type, "cosine": cosine, "bound": min_cosine}
    return None
