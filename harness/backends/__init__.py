"""Backends by name, imported lazily so that a missing optional package costs nothing."""
from __future__ import annotations

from harness.backends.base import Artifacts, Backend, Runner
from harness.registry import Registry

__all__ = ["Artifacts", "Backend", "Runner", "backend_registry"]

_BACKENDS: Registry[type[Backend]] = Registry("backend")
_BACKENDS.add("torch", "harness.backends.pyt:TorchBackend")
_BACKENDS.add("onnxruntime", "harness.backends.onnxrt:OnnxRuntimeBackend")
_BACKENDS.add("tensorrt", "harness.backends.trt:TensorRTBackend")
_BACKENDS.add("tensorrt_rtx", "harness.backends.trt_rtx:TensorRTRTXBackend")
_BACKENDS.add("torch_quant", "harness.backends.torch_quant:TorchQuantBackend")


def backend_registry() -> Registry[type[Backend]]:
    return _BACKENDS
