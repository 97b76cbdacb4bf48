"""Backends by name, imported lazily so that a missing optional package costs nothing."""
from __future__ import annotations

from quantverdict.backends.base import Artifacts, Backend, Runner
from quantverdict.registry import Registry

__all__ = ["Artifacts", "Backend", "Runner", "backend_registry"]

_BACKENDS: Registry[type[Backend]] = Registry("backend")
_BACKENDS.add("torch", "quantverdict.backends.pyt:TorchBackend")
_BACKENDS.add("onnxruntime", "quantverdict.backends.onnxrt:OnnxRuntimeBackend")
_BACKENDS.add("tensorrt", "quantverdict.backends.trt:TensorRTBackend")
_BACKENDS.add("tensorrt_rtx", "quantverdict.backends.trt_rtx:TensorRTRTXBackend")
_BACKENDS.add("torch_quant", "quantverdict.backends.torch_quant:TorchQuantBackend")


def backend_registry() -> Registry[type[Backend]]:
    return _BACKENDS
