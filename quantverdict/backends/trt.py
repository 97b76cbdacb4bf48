"""Full TensorRT backend (TensorRT 10 and 11), through Polygraphy's loaders and ``TrtRunner``.

TensorRT 11 is strongly typed only: the engine is built from the recipe's *native* graph and
only TF32 remains a builder flag. TensorRT 10 keeps the weakly typed legacy path: FP16/BF16/TF32
as builder flags over the FP32 graph, INT8 in implicit mode with a calibrator that reads the
harness's calibration ranges (TensorRT's calibration-cache format), FP8 from the Q/DQ graph
with the FP8 flag. :func:`build_plan` decides which, from the installed version alone, so the
choice is testable without TensorRT; the loaders are lazy and touch TensorRT only when called.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polygraphy.backend.trt import TrtRunner

from quantverdict.backends.base import BUILD_OPTIONS, ENGINE_PLAN, Artifacts, Backend, Runner
from quantverdict.backends.trt_engine import (BuildOptions, cached_engine, engine_summary, gpu_requirement,
                                              profile_from_spec, target_requirement)
from quantverdict.cache import atomic_write_bytes
from quantverdict.capabilities import Capabilities
from quantverdict.errors import UnsupportedError
from quantverdict.hashing import file_sha256
from quantverdict.models.spec import ModelSpec
from quantverdict.precision.trt_cache import to_trt_cache
from quantverdict.precision.wider_layers import precisions_needed

FLAVOUR = "tensorrt"
_LEGACY = {  # TensorRT 10 weak typing: (graph to build from, builder flags, implicit INT8 calibration)
    "fp32": ("fp32", frozenset(), False),
    "tf32": ("fp32", frozenset({"tf32"}), False),
    "fp16": ("fp32", frozenset({"fp16"}), False),
    "bf16": ("fp32", frozenset({"bf16"}), False),
    "int8": ("fp32", frozenset({"int8"}), True),
    "fp8": ("fp8", frozenset({"fp8"}), False),
}


@dataclass(frozen=True)
class BuildPlan:
    """How one precision is built by one TensorRT version."""

    strongly_typed: bool
    graph: str  # "recipe": the precision's native graph; "fp32": the exported FP32 graph
    flags: frozenset[str]  # CreateConfig's boolean precision arguments to set
    implicit_int8_calibration: bool


def build_plan(precision: str, version: str, ranges_suffice: bool = True,
               also: frozenset[str] = frozenset()) -> BuildPlan:
    """``ranges_suffice``: the recipe is the FP32 graph plus calibrated ranges. Where it is more (a user's
    own quantized graph, SmoothQuant, GPTQ…), TensorRT 10 builds INT8 from the recipe's Q/DQ graph
    (explicit quantization, as it builds FP8), since implicit INT8 would quantize the FP32 graph itself. ``also``:
    other precisions the recipe's graph holds (an INT8 recipe's FP8 layers), whose flags TensorRT 10 needs too."""
    major = int(version.split(".")[0])
    if major >= 11:
        return BuildPlan(True, "recipe", frozenset({"tf32"}) if precision == "tf32" else frozenset(), False)
    if major == 10:
        graph, flags, calibrated = _LEGACY[precision]
        flags = flags.union(*(_LEGACY[other][1] for other in also))
        if calibrated and not ranges_suffice:
            return BuildPlan(False, "recipe", flags, False)
        return BuildPlan(False, "recipe" if graph != "fp32" else "fp32", flags, calibrated)
    raise UnsupportedError(f"TensorRT {version} is not supported: the harness targets TensorRT 10 and 11")


def make_loaders(onnx_path: Path, plan: BuildPlan, options: BuildOptions, timing_cache: Path,
                 calibrator: Any = None) -> Any:
    """Polygraphy's lazy ``EngineBytesFromNetwork`` chain; nothing touches TensorRT until it is called
    (except ``calibrator``, a Polygraphy ``Calibrator``, which the implicit INT8 plan needs)."""
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath, Profile

    if plan.implicit_int8_calibration and calibrator is None:
        raise UnsupportedError("TensorRT 10 implicit INT8 needs a calibrator")
    profile = Profile()
    for name, low, opt, high in options.profiles:
        profile.add(name, min=low, opt=opt, max=high)
    flags = {flag: True for flag in plan.flags}
    limits = None
    if options.workspace_bytes is not None:
        import tensorrt

        limits = {tensorrt.MemoryPoolType.WORKSPACE: options.workspace_bytes}
    config = CreateConfig(**flags, profiles=[profile], calibrator=calibrator, load_timing_cache=str(timing_cache),
                          builder_optimization_level=options.optimization_level, memory_pool_limits=limits)
    network = NetworkFromOnnxPath(str(onnx_path), strongly_typed=plan.strongly_typed or None)
    return EngineBytesFromNetwork(network, config=config, save_timing_cache=str(timing_cache))


class TensorRTBackend(Backend):
    name = "tensorrt"
    precisions = frozenset({*_LEGACY, "fp4"})
    gpu_precisions = precisions
    recipe_target = "native"

    def unavailable(self, caps: Capabilities) -> str | None:
        if caps.gpu is None:
            return "tensorrt backend runs on an NVIDIA GPU; none found"
        if not caps.has("tensorrt"):
            return "tensorrt backend needs TensorRT 10 or 11 (pip install tensorrt from NVIDIA's index); not installed"
        return None

    def requirement(self, spec: ModelSpec, precision: str, caps: Capabilities) -> str | None:
        return gpu_requirement(spec, precision, caps)

    def load(self, artifacts: Artifacts) -> Runner:
        import tensorrt
        from polygraphy.backend.trt import EngineFromBytes

        precision, settings = artifacts.recipe.name, artifacts.recipe.params()
        also = frozenset(needed for needed, _ in precisions_needed(precision, settings)[1:])
        plan = build_plan(precision, tensorrt.__version__, artifacts.ranges is not None, also)
        onnx_path = artifacts.onnx_path() if plan.graph == "recipe" else artifacts.fp32_onnx()
        import torch

        gpu = (torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))  # engines are GPU-specific
        reason = target_requirement(precision, settings, gpu[1], f"this GPU ({gpu[0]})")
        if reason:
            raise UnsupportedError(reason)
        build = BuildOptions(tf32="tf32" in plan.flags, profiles=profile_from_spec(artifacts.spec))
        calibrator = None
        if plan.implicit_int8_calibration:  # TensorRT reads the harness's ranges from this cache file
            from polygraphy.backend.trt import Calibrator

            assert artifacts.ranges is not None

            calibration_cache = artifacts.cache.root / "trt-calibration" / f"{onnx_path.stem}.cache"
            atomic_write_bytes(calibration_cache, to_trt_cache(artifacts.ranges()).encode())
            calibrator = Calibrator(iter(artifacts.calibration_batches()), cache=str(calibration_cache))
        timing_cache = artifacts.cache.root / "timing" / f"tensorrt-{tensorrt.__version__}.cache"
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
        loaders = make_loaders(onnx_path, plan, build, timing_cache, calibrator)
        engine = cached_engine(FLAVOUR, tensorrt.__version__, onnx_path, artifacts.recipe.name,
                               repr((plan, build, gpu)), lambda: bytes(loaders()), artifacts.cache)
        runner = InspectedTrtRunner(EngineFromBytes(engine.read_bytes()), name=f"tensorrt-{artifacts.recipe.name}")
        runner.build_options, runner.engine_plan = repr((plan, build, gpu)), file_sha256(engine)
        return runner


class InspectedTrtRunner(TrtRunner):
    """Polygraphy's ``TrtRunner`` that also reports the engine inspector's per-layer precisions and the options its
    engine was built with."""

    build_options = ""
    engine_plan = ""

    def describe(self) -> dict[str, Any]:
        import tensorrt

        return {**engine_summary(tensorrt, self.engine), BUILD_OPTIONS: self.build_options,
                ENGINE_PLAN: self.engine_plan}
