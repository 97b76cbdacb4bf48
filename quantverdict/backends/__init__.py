"""Backends by name, imported lazily so that a missing optional package costs nothing. Adding a backend
means its module and one entry here, or, from an installed package, one entry point in the
``quantverdict.backends`` group (``name = "module:BackendClass"``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from quantverdict.registry import Registry

if TYPE_CHECKING:
    from quantverdict.backends.base import Artifacts, Backend, Diagnosis, Runner, infer_all

__all__ = ["Artifacts", "Backend", "Diagnosis", "Runner", "backend_registry", "infer_all"]

ENTRY_POINT_GROUP = "quantverdict.backends"
_BACKENDS: "Registry[type[Backend]]" = Registry("backend", ENTRY_POINT_GROUP)
_BACKENDS.add("torch", "quantverdict.backends.pyt:TorchBackend")
_BACKENDS.add("onnxruntime", "quantverdict.backends.onnxrt:OnnxRuntimeBackend")
_BACKENDS.add("tensorrt", "quantverdict.backends.trt:TensorRTBackend")
_BACKENDS.add("tensorrt_rtx", "quantverdict.backends.trt_rtx:TensorRTRTXBackend")
_BACKENDS.add("torch_quant", "quantverdict.backends.torch_quant:TorchQuantBackend")


def backend_registry() -> "Registry[type[Backend]]":
    return _BACKENDS


def __getattr__(name: str) -> object:  # the interface, imported when first used (it imports onnx and NumPy)
    if name in ("Artifacts", "Backend", "Diagnosis", "Runner", "infer_all"):
        from quantverdict.backends import base

        return getattr(base, name)
    raise AttributeError(name)
