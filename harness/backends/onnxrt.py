"""ONNX Runtime backend: runs each precision's ONNX graph on the CPU provider (CUDA if installed).

ONNX Runtime cannot fuse float8 Q/DQ into its integer kernels and fails to load such graphs
with optimisations on, so those run with optimisations disabled (fake-quant in float).
"""
from __future__ import annotations

from pathlib import Path


import numpy as np
import onnx
from onnx import TensorProto

from harness.backends.base import Artifacts, Backend, Runner
from harness.capabilities import Capabilities
from harness.models.spec import Batch, ModelSpec

_FLOAT8 = {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}


def _has_float8(path: Path) -> bool:
    model = onnx.load(str(path), load_external_data=False)
    return any(init.data_type in _FLOAT8 for init in model.graph.initializer)


class OnnxRuntimeRunner(Runner):
    name = "onnxruntime"

    def __init__(self, path: Path, providers: list[str], optimize: bool):
        self.path, self.providers, self.optimize = path, providers, optimize

    def activate_impl(self) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if not self.optimize:
            options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.session = onnxruntime.InferenceSession(str(self.path), options, providers=self.providers)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def infer_impl(self, feed: Batch) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(self.output_names, dict(feed))))

    def deactivate_impl(self) -> None:
        del self.session


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    precisions = frozenset({"fp32", "tf32", "fp16", "bf16", "int8", "fp8", "fp4"})
    gpu_precisions = frozenset({"tf32"})

    def unavailable(self, caps: Capabilities) -> str | None:
        if not (caps.has("onnxruntime") or caps.has("onnxruntime-gpu")):
            return "onnxruntime backend needs onnxruntime; not installed"
        return None

    def requirement(self, spec: ModelSpec, precision: str, caps: Capabilities) -> str | None:
        if precision == "tf32" and not _cuda_provider():
            return "tf32 on onnxruntime needs the CUDA execution provider (onnxruntime-gpu); not available"
        return None

    def load(self, artifacts: Artifacts) -> Runner:
        path = artifacts.onnx_path()
        providers = ["CPUExecutionProvider"]
        if _cuda_provider():
            tf32 = int(bool(artifacts.recipe.runtime.get("tf32")))
            providers = [("CUDAExecutionProvider", {"use_tf32": tf32}), *providers]  # type: ignore[list-item]
        return OnnxRuntimeRunner(path, providers, optimize=not _has_float8(path))


def _cuda_provider() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()
