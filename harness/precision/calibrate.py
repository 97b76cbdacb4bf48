"""Activation-range calibration over a calibration set, cached by content hash.

Ranges are collected in one pass per batch by exposing the wanted tensors as extra graph
outputs of the FP32 model under ONNX Runtime (optimisations off, so every tensor exists as
named). The cache entry is readable JSON: method, parameters, versions and per-tensor amax.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Mapping, Sequence

import numpy as np
import onnx

from harness.cache import Cache, content_hash
from harness.errors import CalibrationError
from harness.models.spec import Batch

FORWARD_PASSES: Counter = Counter()
"""Calibration forward passes run in this process, by model graph name (tests count them)."""

METHODS = ("max",)


def calibrate(
    cache: Cache,
    model_bytes: bytes,
    tensors: Sequence[str],
    batches: Sequence[Batch],
    method: str = "max",
) -> dict[str, float]:
    """Per-tensor amax of ``tensors`` over ``batches``; a cache hit runs no forward pass."""
    if method not in METHODS:
        raise CalibrationError(f"unknown calibration method {method!r}; known: {', '.join(METHODS)}")
    if not batches:
        raise CalibrationError("calibration set is empty")
    import onnxruntime

    key = content_hash("calibration", model_bytes, list(tensors), list(batches), method)

    def produce() -> bytes:
        ranges = _collect_amax(model_bytes, tensors, batches)
        document = {"method": method, "params": {}, "onnxruntime": onnxruntime.__version__,
                    "batches": len(batches), "ranges": ranges}
        return json.dumps(document, indent=1, sort_keys=True).encode()

    path = cache.get_or_create("calibration", key, ".json", produce, {"method": method, "tensors": len(tensors)})
    return json.loads(path.read_text())["ranges"]


def _collect_amax(model_bytes: bytes, tensors: Sequence[str], batches: Sequence[Batch]) -> dict[str, float]:
    import onnxruntime

    model = onnx.load_from_string(model_bytes)
    existing = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors if t not in existing)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    amax = dict.fromkeys(tensors, 0.0)
    for batch in batches:
        values = session.run(list(tensors), dict(batch))
        FORWARD_PASSES[model.graph.name] += 1
        for name, value in zip(tensors, values):
            amax[name] = max(amax[name], float(np.max(np.abs(value))) if value.size else 0.0)
    return amax
