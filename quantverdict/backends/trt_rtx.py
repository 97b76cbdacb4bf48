"""TensorRT-RTX backend: builds engines ahead of time on any machine, runs them on RTX-class GPUs.

The build needs no GPU (it targets a chosen compute capability), so it is exercised in CI;
running needs a GPU TensorRT-RTX supports (``capabilities.RTX_RUNTIME_CC``).
"""
from __future__ import annotations

from pathlib import Path
from types import ModuleType


from quantverdict.backends.base import Artifacts, Backend, Runner
from quantverdict.backends.trt_engine import (BuildOptions, EngineRunner, build_engine, gpu_requirement,
                                              profile_from_spec, target_requirement)
from quantverdict.capabilities import RTX_BUILD_TARGETS, Capabilities
from quantverdict.errors import UnsupportedError
from quantverdict.models.spec import ModelSpec

FLAVOUR = "tensorrt_rtx"


def _trt() -> ModuleType:
    import tensorrt_rtx

    return tensorrt_rtx


class TensorRTRTXBackend(Backend):
    name = "tensorrt_rtx"
    precisions = frozenset({"fp32", "tf32", "fp16", "bf16", "int8", "fp8"})
    gpu_precisions = precisions
    recipe_target = "native"

    def unavailable(self, caps: Capabilities) -> str | None:
        """The GPU first: on one TensorRT-RTX refuses (an H100, say), that is the reason that matters."""
        if caps.rtx_runtime_requirement():
            return caps.rtx_runtime_requirement()
        if not caps.has("tensorrt-rtx"):
            return "tensorrt_rtx backend needs tensorrt-rtx (pip install -e '.[rtx]'); not installed"
        return None

    def requirement(self, spec: ModelSpec, precision: str, caps: Capabilities) -> str | None:
        return gpu_requirement(spec, precision, caps)

    def build(self, artifacts: Artifacts, target_cc: tuple[int, int]) -> Path:
        """The engine for ``target_cc`` (ahead of time: no GPU needed); cached."""
        precision = artifacts.recipe.name
        if target_cc not in RTX_BUILD_TARGETS:
            raise UnsupportedError(f"TensorRT-RTX cannot target compute capability {target_cc[0]}.{target_cc[1]}")
        reason = target_requirement(precision, artifacts.recipe.params(), target_cc)
        if reason:
            raise UnsupportedError(reason)
        return build_engine(_trt(), FLAVOUR, artifacts.onnx_path(), precision, self.options(artifacts, target_cc),
                            artifacts.cache)

    def options(self, artifacts: Artifacts, target_cc: tuple[int, int]) -> BuildOptions:
        return BuildOptions(target_cc=target_cc, tf32=bool(artifacts.recipe.runtime.get("tf32")),
                            profiles=profile_from_spec(artifacts.spec))

    def load(self, artifacts: Artifacts) -> Runner:
        import torch

        target = torch.cuda.get_device_capability(0)
        return EngineRunner(_trt(), self.build(artifacts, target), repr(self.options(artifacts, target)))
