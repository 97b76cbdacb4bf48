"""Pipeline properties checked on generated architectures (tests/test_properties.py) and replayed
from saved regression files (tests/test_regressions.py). Each raises AssertionError with the
numbers when the property fails.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
import torch
import torch.nn.functional as F

from quantverdict.export.compat import serialized
from quantverdict.generate.arch import Architecture
from quantverdict.backends.onnxrt import OnnxRuntimeRunner
from quantverdict.cache import Cache, atomic_write_bytes
from quantverdict.export import export_onnx
from quantverdict.models.spec import InputSpec, ModelSpec
from quantverdict.precision import get_recipe
from quantverdict.precision.calibrate import calibrate
from quantverdict.precision.grids import FP8_E4M3, INT8
from quantverdict.precision.qdq import QDQ
from quantverdict.generate.strategies import Inputs

UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
LIPSCHITZ = {"relu": 1.0, "gelu": 1.13, "silu": 1.1, "sigmoid": 0.25}  # max |f'| of each activation


def _spec(arch: Architecture) -> ModelSpec:
    return ModelSpec(f"arch-{arch.digest}", [InputSpec("input", (2, *arch.input_shape))], ["output"],
                     build=arch.build, calibration="synthetic")


def _fp32_graph(arch: Architecture, cache: Cache) -> tuple[Any, Path]:
    module = arch.build()
    return module, export_onnx(_spec(arch), module, cache)


def _run(path: Path, x: np.ndarray, optimize: bool = True) -> np.ndarray:
    with OnnxRuntimeRunner(path, ["CPUExecutionProvider"], optimize) as runner:
        return runner.infer({"input": x})["output"]


def _torch(module: Any, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


def export_matches_torch(arch: Architecture, inputs: Inputs, cache: Cache) -> None:
    """ONNX Runtime on the export equals PyTorch in FP32, at a batch size the export did not trace."""
    module, path = _fp32_graph(arch, cache)
    x = inputs.array(arch.input_shape)
    got, want = _run(path, x), _torch(module, x)
    scale = max(1.0, float(np.abs(want).max()))
    error = float(np.abs(got - want).max())
    assert got.shape == want.shape and error <= 1e-4 * scale, f"FP32 export differs by {error:.3g} (scale {scale:.3g})"


def _layernorm_condition(module: Any, x: np.ndarray) -> float:
    """Largest |mean| / std over the rows LayerNorm normalises: how much it amplifies the relative
    rounding error of its input (rounding perturbs x by ≈ u·|mean|; LayerNorm divides by std)."""
    worst = [1.0]

    def hook(_: Any, args: tuple) -> None:
        rows = args[0].detach().double()
        mean, std = rows.mean(-1).abs(), rows.std(-1, unbiased=False)
        worst.append(float((mean / (std + 1e-12)).max()))

    handles = [m.register_forward_pre_hook(hook) for m in module.modules() if isinstance(m, torch.nn.LayerNorm)]
    try:
        _torch(module, x)
    finally:
        for handle in handles:
            handle.remove()
    return max(worst)


def low_precision_within_format_bound(arch: Architecture, inputs: Inputs, precision: str, cache: Cache) -> None:
    """Rounding every tensor to FP16/BF16 costs at most 4·n·u·κ of the output's norm (n: rounding
    points, u: unit roundoff, κ: the LayerNorms' conditioning, at least 1)."""
    module, path = _fp32_graph(arch, cache)
    graph = onnx.load(str(path))
    rounded = cache.root / "properties" / f"{arch.digest}-{precision}.onnx"
    atomic_write_bytes(rounded, serialized(get_recipe(precision).apply(graph)))
    x = inputs.array(arch.input_shape)
    got, want = _run(rounded, x), _torch(module, x)
    rounding_points = len(graph.graph.node) + len(graph.graph.input)
    kappa = _layernorm_condition(module, x)
    bound = 4 * rounding_points * UNIT_ROUNDOFF[precision] * kappa * float(np.linalg.norm(want)) + 1e-6
    error = float(np.linalg.norm(got - want))
    assert error <= bound, (f"{precision}: ‖error‖ {error:.3g} > bound {bound:.3g} (4 · {rounding_points} roundings "
                            f"· u={UNIT_ROUNDOFF[precision]:.3g} · κ={kappa:.3g} · ‖ref‖)")


def _rounding_error(fmt_name: str, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Largest |dequantize(quantize(v)) − v| for values within range: half a step for INT8; for
    E4M3 half a unit in the last place of a 3-bit mantissa, or half the subnormal spacing."""
    if fmt_name == "int8":
        return (scale / 2).expand_as(values)
    return values.abs() * 2.0 ** -4 + scale * 2.0 ** -10


def quantized_layer_within_scale_bound(arch: Architecture, inputs: Inputs, recipe: QDQ, cache: Cache) -> None:
    """One quantized Conv/Linear (+ activation): every output element within the bound derived from
    the activation scale and the per-channel weight scales (no clipping: calibrated on this batch)."""
    recipe = recipe.with_options(tensorrt_kernels=False)  # every shape the format expresses, not only TensorRT's
    module, path = _fp32_graph(arch, cache)
    x = inputs.array(arch.input_shape)
    graph = onnx.load(str(path))
    ranges = calibrate(cache, path.read_bytes(), recipe.tensors_to_calibrate(graph), [{"input": x}], recipe.calibrator)
    quantized = cache.root / "properties" / f"{arch.digest}-{recipe.fmt.name}-{inputs.seed}.onnx"
    atomic_write_bytes(quantized, serialized(recipe.apply(graph, ranges)))
    got, want = _run(quantized, x, optimize=False), _torch(module, x)

    layer = module[0]
    fmt = recipe.fmt.name
    weight = layer.weight.detach()
    xt = torch.from_numpy(x)
    sx = torch.tensor(max(ranges["input"], 1e-12) / (INT8 if fmt == "int8" else FP8_E4M3).qmax)
    axes = tuple(range(1, weight.ndim))
    sw = weight.abs().amax(dim=axes, keepdim=True) / (INT8 if fmt == "int8" else FP8_E4M3).qmax
    ex, ew = _rounding_error(fmt, xt, sx), _rounding_error(fmt, weight, sw)
    if isinstance(layer, torch.nn.Conv2d):
        apply = lambda a, w: F.conv2d(a, w, None, layer.stride, layer.padding, layer.dilation, layer.groups)  # noqa: E731
    else:
        apply = lambda a, w: F.linear(a, w)  # noqa: E731
    bound = apply(ex, weight.abs()) + apply(xt.abs() + ex, ew)
    activation = arch.blocks[1]["type"] if len(arch.blocks) > 1 else None
    bound = (bound * LIPSCHITZ.get(activation, 1.0)).numpy() + 1e-5 * (1 + np.abs(want))
    excess = np.abs(got - want) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess.max() <= 0, (f"{fmt}: element {list(map(int, worst))} error {abs(got - want)[worst]:.4g} exceeds "
                               f"its scale-derived bound {bound[worst]:.4g}")


@contextlib.contextmanager
def saved_on_failure(directory: Path, property_name: str, arch: Architecture, inputs: Inputs,
                     params: dict[str, Any]) -> Iterator[None]:
    """Write the example to ``directory`` when the property fails. Hypothesis replays its shrunk,
    minimal example last, so each new failure replaces this session's earlier file for the property."""
    try:
        yield
    except AssertionError as exc:
        path = directory / f"{property_name}-{arch.digest}.json"
        previous = _SAVED.get((directory, property_name))
        if previous is not None and previous != path:
            previous.unlink(missing_ok=True)
        document = {"property": property_name, "architecture": json.loads(arch.to_json()), "inputs": inputs.to_dict(),
                    "params": params, "failure": str(exc).splitlines()[0],
                    "explanation": "TODO: why this fails, and whether it is a harness, exporter or runtime bug"}
        atomic_write_bytes(path, json.dumps(document, indent=1).encode())
        _SAVED[(directory, property_name)] = path
        raise


_SAVED: dict[tuple[Path, str], Path] = {}
