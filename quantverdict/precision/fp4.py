"""NVFP4 simulated on the CPU: weights fake-quantized to E2M1 in blocks of 16.

Each block of 16 consecutive weights along the input (reduction) axis shares an E4M3 scale,
under one FP32 scale per tensor (amax / (448 · 6)), as NVIDIA's NVFP4 defines. The graph keeps
FP32 weights holding the dequantized values, so any FP32 executor reports FP4's accuracy cost
even where no GPU supports FP4 (it needs compute capability ≥ 10.0). Activations are not
quantized: NVFP4 scales them per block at run time, which a static graph cannot express.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper

from quantverdict.errors import CalibrationError, UnsupportedError
from quantverdict.precision.base import Recipe
from quantverdict.precision.graph import int_attribute
from quantverdict.precision.coverage import layers
from quantverdict.precision.placement import WEIGHTED_OPS
from quantverdict.precision.settings import RecipeSettings, Unset

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # index = magnitude code


def round_e2m1(values: np.ndarray) -> np.ndarray:
    """Round to the nearest E2M1 value, ties to the even code, saturating at ±6."""
    magnitude = np.minimum(np.abs(values), E2M1_MAX)
    upper = np.clip(np.searchsorted(E2M1_GRID, magnitude), 1, len(E2M1_GRID) - 1)
    lower = upper - 1
    below, above = magnitude - E2M1_GRID[lower], E2M1_GRID[upper] - magnitude
    pick_upper = (above < below) | ((above == below) & (upper % 2 == 0))
    return np.sign(values) * np.where(pick_upper, E2M1_GRID[upper], E2M1_GRID[lower])


def round_e4m3(values: np.ndarray) -> np.ndarray:
    return values.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


def nvfp4_scales(weight: np.ndarray, axis: int) -> np.ndarray:
    """Each weight's scale (weight's shape): its block's E4M3 scale times the tensor's FP32 scale, blocks
    of 16 along ``axis`` (the reduction axis); an all-zero block gets the tensor's scale."""
    moved = np.moveaxis(weight.astype(np.float32), axis, -1)
    length = moved.shape[-1]
    padded = np.pad(moved, [(0, 0)] * (moved.ndim - 1) + [(0, (-length) % BLOCK)])
    blocks = padded.reshape(*padded.shape[:-1], -1, BLOCK)
    tensor_scale = max(float(np.abs(weight).max()), 1e-12) / (E4M3_MAX * E2M1_MAX)
    block_amax = np.abs(blocks).max(axis=-1, keepdims=True)
    block_scale = round_e4m3(block_amax / E2M1_MAX / tensor_scale)
    safe = np.where(block_scale > 0, block_scale, 1.0) * tensor_scale
    return np.moveaxis(np.broadcast_to(safe, blocks.shape).reshape(padded.shape)[..., :length], -1, axis)


def fake_quantize_nvfp4(weight: np.ndarray, axis: int) -> np.ndarray:
    """Quantize-dequantize ``weight`` in blocks of 16 along ``axis`` (the reduction axis)."""
    scales = nvfp4_scales(weight, axis)
    return (round_e2m1(weight.astype(np.float32) / scales) * scales).astype(np.float32)


def _block_scales(node: onnx.NodeProto, weight: np.ndarray) -> np.ndarray | None:
    return nvfp4_scales(weight, _reduction_axis(node, weight.ndim)) if node.op_type in WEIGHTED_OPS else None


def _reduction_axis(node: onnx.NodeProto, rank: int) -> int:
    if node.op_type == "Conv":
        return 1  # [out, in/groups, kh, kw]
    if node.op_type == "Gemm":
        return 1 if int_attribute(node, "transB", 0) else 0
    return 0 if rank == 2 else rank - 2  # MatMul: [.., in, out]


class NVFP4Weights(Recipe):
    """``gptq``: weights rounded by GPTQ (quantverdict.precision.gptq) on the same blocks and scales, H from the
    calibration set: at 4 bits rounding to nearest loses most, and GPTQ was made for it."""

    name = "fp4"
    quantized = True
    configurable = True

    def __init__(self, gptq: bool = False):
        self.gptq = gptq
        self.calibration_data = gptq  # GPTQ's H comes from the calibration batches

    def configured(self, settings: RecipeSettings | Mapping[str, object]) -> Recipe:
        """FP4 takes GPTQ's rounding alone (:class:`RecipeSettings`)."""
        given = RecipeSettings.parse(settings, self.name)
        unknown = given.unset("gptq").given()
        if unknown:
            raise CalibrationError(f"unknown fp4 recipe setting(s) {sorted(unknown)}; known: ['gptq']")
        return NVFP4Weights(self.gptq if isinstance(given.gptq, Unset) else given.gptq)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "block": BLOCK, "scale": "e4m3 per block, fp32 per tensor", "activations": None,
                "gptq": self.gptq}

    def apply_batches(self, model: onnx.ModelProto, batches: Sequence[Any]) -> onnx.ModelProto:
        from quantverdict.precision.gptq import round_fake_quantized

        return round_fake_quantized(self.apply(model), model, batches, _block_scales, round_e2m1)

    def planned_layers(self, source: onnx.ModelProto) -> set[str]:
        return self.rewritten_layers(source)

    def rewritten_layers(self, source: onnx.ModelProto) -> set[str]:
        """The layers whose weights :meth:`apply_impl` rounds to FP4 in place."""
        weights = {init.name for init in source.graph.initializer}
        return {node.name for node in source.graph.node
                if node.op_type in WEIGHTED_OPS and len(node.input) > 1 and node.input[1] in weights}

    def float_reasons(self, source: onnx.ModelProto) -> dict[str, str]:
        """FP4 is simulated on constant weights: other kinds, and products of two activations, stay float."""
        rewritten = self.rewritten_layers(source)
        top_level = {node.name for node in source.graph.node}  # a control-flow body's layers get no reason: missed
        return {layer.name: f"no kernel: FP4 is simulated on the weights of {', '.join(WEIGHTED_OPS)} only"
                if layer.kind not in WEIGHTED_OPS else "no kernel: FP4 is simulated on weights, and this layer's "
                "operands are activations" for layer in layers(source)
                if layer.name not in rewritten and layer.name in top_level}

    def for_target(self, target: str) -> Recipe:
        if target == "native":  # a TensorRT engine from this graph would be FP32 posing as FP4
            raise UnsupportedError("native NVFP4 graphs (FLOAT4E2M1 Q/DQ, opset 23) are not implemented yet; "
                                   "FP4 is simulated on onnxruntime")
        return self

    def apply_impl(self, model: onnx.ModelProto, ranges: Mapping[str, float]) -> onnx.ModelProto:
        weights = {init.name: init for init in model.graph.initializer}
        done: set[str] = set()
        for node in model.graph.node:
            if node.op_type in WEIGHTED_OPS and len(node.input) > 1 and node.input[1] in weights:
                name = node.input[1]
                if name in done:
                    continue
                values = numpy_helper.to_array(weights[name])
                axis = _reduction_axis(node, values.ndim)
                weights[name].CopyFrom(numpy_helper.from_array(fake_quantize_nvfp4(values, axis), name))
                done.add(name)
        return model

FP4_RECIPE = NVFP4Weights()
