"""Engine building and running shared by the TensorRT and TensorRT-RTX backends (same API).

Both are strongly typed (TensorRT 11, TensorRT-RTX): precision comes from the ONNX graph, so
the build takes only the graph, the optimisation profile and math options. Engines are cached
by the graph's bytes, the flavour and its version, the target compute capability, the profile
and the options. A parser failure names the node, its op and the recipe that produced it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping

import numpy as np

from quantverdict.backends.base import BUILD_OPTIONS, ENGINE_PLAN, Runner
from quantverdict.cache import Cache
from quantverdict.capabilities import Capabilities, cc_requirement
from quantverdict.hashing import content_hash, file_sha256, source_fingerprint
from quantverdict.errors import HarnessError, UnsupportedError
from quantverdict.models.spec import Batch, ModelSpec
from quantverdict.precision.wider_layers import precisions_needed


@dataclass(frozen=True)
class BuildOptions:
    """Everything besides the graph that changes the engine."""

    target_cc: tuple[int, int] | None = None  # ahead-of-time target (TensorRT-RTX); None: this GPU
    tf32: bool = False
    optimization_level: int | None = None
    workspace_bytes: int | None = None
    profiles: tuple[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...] = field(default=())


def profile_from_spec(spec: ModelSpec) -> tuple[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...]:
    """min/opt/max shapes: dynamic axes from 1 up to twice the spec's size, optimised for the spec."""
    shapes = []
    for item in spec.inputs:
        opt = tuple(item.shape)
        low = tuple(1 if axis in item.dynamic_axes else size for axis, size in enumerate(opt))
        high = tuple(2 * size if axis in item.dynamic_axes else size for axis, size in enumerate(opt))
        shapes.append((item.name, low, opt, high))
    return tuple(shapes)


def cached_engine(flavour: str, version: str, onnx_path: Path, recipe_name: str, options_key: str,
                  produce: Any, cache: Cache) -> Path:
    """The engine for this graph, flavour, version and options, from the cache or ``produce()``."""
    key = content_hash("engine", onnx_path.read_bytes(), flavour, version, options_key,
                       source_fingerprint("quantverdict.backends.trt_engine"))
    return cache.get_or_create("engine", key, ".engine", produce,
                               {"flavour": flavour, "version": version, "onnx": str(onnx_path),
                                "recipe": recipe_name, "options": options_key})


def build_engine(trt: ModuleType, flavour: str, onnx_path: Path, recipe_name: str, options: BuildOptions,
                 cache: Cache) -> Path:
    """The serialized engine for ``onnx_path`` (built with the builder API directly), cached."""
    return cached_engine(flavour, trt.__version__, onnx_path, recipe_name, repr(options),
                         lambda: _build(trt, onnx_path.read_bytes(), onnx_path, recipe_name, options), cache)


def _build(trt: ModuleType, onnx_bytes: bytes, onnx_path: Path, recipe_name: str, options: BuildOptions) -> bytes:
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        raise _parser_error(parser, onnx_path, recipe_name)
    config = builder.create_builder_config()
    _configure(trt, builder, config, options)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        target = f" for compute capability {options.target_cc[0]}.{options.target_cc[1]}" if options.target_cc else ""
        raise UnsupportedError(f"{onnx_path} ({recipe_name} recipe): TensorRT could not build an engine{target}")
    return bytes(engine)


def _network_flags(trt: ModuleType) -> int:
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def _configure(trt: ModuleType, builder: Any, config: Any, options: BuildOptions) -> None:
    if options.target_cc is not None:
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, f"SM{options.target_cc[0]}{options.target_cc[1]}"), 0)
    if options.tf32:
        config.set_flag(trt.BuilderFlag.TF32)
    elif hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    if options.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    if options.profiles:
        profile = builder.create_optimization_profile()
        for name, low, opt, high in options.profiles:
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)


def _parser_error(parser: Any, onnx_path: Path, recipe_name: str) -> UnsupportedError:
    errors, ops = [], []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        if error.node() >= 0:
            ops.append(error.node_operator())
            errors.append(f"node {error.node()} {error.node_name()!r} (op {error.node_operator()}): {error.desc().strip()}")
        else:
            errors.append(f"graph: {error.desc().strip()}")
    message = f"TensorRT's ONNX parser rejected {onnx_path} ({recipe_name} recipe): " + "; ".join(errors or ["no detail"])
    return UnsupportedError(message, tuple(ops))


def engine_summary(trt: ModuleType, engine: Any) -> dict[str, Any]:
    """Layer count and layers per precision, from the engine inspector (needs a deserialized engine
    built with detailed profiling verbosity, Polygraphy's default)."""
    import json

    inspector = engine.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    precisions: dict[str, int] = {}
    for layer in info.get("Layers", []):
        if isinstance(layer, dict):
            for tensor in layer.get("Outputs", [])[:1]:
                fmt = str(tensor.get("Format/Datatype", "unknown")).split()[0]
                precisions[fmt] = precisions.get(fmt, 0) + 1
    return {"layers": len(info.get("Layers", [])), "output_formats": precisions}


class EngineRunner(Runner):
    """Runs a serialized engine on the current CUDA device; I/O buffers are torch CUDA tensors."""

    name = "tensorrt-engine"

    def __init__(self, trt: ModuleType, engine_path: Path, build_options: str = ""):
        self.trt, self.engine_path, self.build_options = trt, engine_path, build_options

    def activate_impl(self) -> None:
        import torch

        trt = self.trt
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
        self.engine = self.runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        if self.engine is None:
            raise HarnessError(f"engine {self.engine_path} could not be deserialized on this GPU")
        self.context = self.engine.create_execution_context()
        self.stream = torch.cuda.Stream()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]

    def infer_impl(self, feed: Batch) -> dict[str, np.ndarray]:
        import torch

        keep = []
        for name, array in feed.items():
            tensor = torch.from_numpy(np.ascontiguousarray(array)).cuda()
            self.context.set_input_shape(name, tuple(tensor.shape))
            self.context.set_tensor_address(name, tensor.data_ptr())
            keep.append(tensor)
        results = {}
        for name in self.outputs:
            dtype = torch.from_numpy(np.empty(0, self.trt.nptype(self.engine.get_tensor_dtype(name)))).dtype
            out = torch.empty(tuple(self.context.get_tensor_shape(name)), dtype=dtype, device="cuda")
            self.context.set_tensor_address(name, out.data_ptr())
            results[name] = out
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise HarnessError(f"engine {self.engine_path}: execution failed")
        self.stream.synchronize()
        return {name: out.float().cpu().numpy() for name, out in results.items()}

    def describe(self) -> dict[str, Any]:
        return {**engine_summary(self.trt, self.engine), BUILD_OPTIONS: self.build_options,
                ENGINE_PLAN: file_sha256(self.engine_path)}

    def deactivate_impl(self) -> None:
        del self.context, self.engine, self.runtime


def gpu_requirement(spec: ModelSpec, precision: str, caps: Capabilities) -> str | None:
    """Why this GPU cannot run ``precision`` with the recipe settings ``spec`` declares for it (an INT8 recipe with
    FP8 layers needs FP8's compute capability too), or None."""
    return _first_unmet(precision, spec.recipe.get(precision, {}), caps.gpu_requirement)


def target_requirement(precision: str, settings: Mapping[str, Any], cc: tuple[int, int],
                       subject: str = "the build target") -> str | None:
    """As :func:`gpu_requirement`, for ``subject`` of compute capability ``cc`` and a recipe's ``settings`` (those a
    run's ``--recipe-option`` set too)."""
    return _first_unmet(precision, settings, lambda needed: cc_requirement(needed, cc, subject))


def _first_unmet(precision: str, settings: Mapping[str, Any], unmet: Callable[[str], str | None]) -> str | None:
    """The most demanding of the precisions ``precision`` with ``settings`` needs (:func:`precisions_needed`) that
    ``unmet`` gives a reason for, with why it is needed (a runner with no GPU hears that FP8 layers need 8.9, not
    that INT8 needs 6.1); None where every one is met."""
    for needed, why in reversed(precisions_needed(precision, settings)):
        reason = unmet(needed)
        if reason:
            return why + reason
    return None
