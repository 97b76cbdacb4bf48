"""Exact semantics of ONNX's integer operators, the same on every CPU.

ONNX Runtime's ``MatMulInteger``, ``ConvInteger``, ``QLinearMatMul`` and ``QLinearConv`` kernels are
integer code paths chosen by instruction set even with graph optimisations off (measured on an AVX2-only
CPU: 10 of 56 ``MatMulInteger`` layers of a trained encoder off by up to 3,302 in int32), so a graph built
of them has no CPU-independent meaning under it. ONNX's reference evaluator defines them; its
accumulations are exact but run as NumPy integer loops. Here those four accumulate integer values in
float64, where every partial sum is an integer below 2**53, so no summation order can round them: the
result is the exact int32 sum, at BLAS speed. Everything else in the graph is the reference evaluator's.
Graphs with operators outside ONNX's own domains (ONNX Runtime's ``com.microsoft`` integer kernels)
have no reference semantics and are left to ONNX Runtime.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

from quantverdict.backends.samples import joined
from quantverdict.precision.coverage import INTEGER_LAYERS

INTEGER_OPS = (*INTEGER_LAYERS, "DynamicQuantizeLinear")
REFERENCE_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def has_integer_ops(model: onnx.ModelProto) -> bool:
    return any(node.op_type in INTEGER_OPS for node in model.graph.node)


def reference_evaluable(model: onnx.ModelProto) -> bool:
    """Whether ONNX's reference evaluator defines every node (no contrib-domain kernels)."""
    return all((node.domain or "") in REFERENCE_DOMAINS for node in model.graph.node)


def exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` of integer arrays, exact (float64 partial sums of integers stay integers below 2**53)."""
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)


def exact_conv(x: np.ndarray, w: np.ndarray, group: int, pads: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int]) -> np.ndarray:
    """A grouped N-d convolution of integer arrays (no bias), exact: im2col windows summed in float64."""
    spatial = x.ndim - 2
    xf = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *((pads[i], pads[i + spatial]) for i in range(spatial))])
    kernel = w.shape[2:]
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    windows = np.lib.stride_tricks.sliding_window_view(xf, extent, axis=tuple(range(2, 2 + spatial)))
    windows = windows[(slice(None), slice(None), *(slice(None, None, s) for s in strides),
                       *(slice(None, None, d) for d in dilations))]
    batch, channels = x.shape[:2]
    out_shape = windows.shape[2:2 + spatial]
    per_group, outputs = channels // group, w.shape[0] // group
    windows = windows.reshape(batch, group, per_group, *out_shape, *kernel)
    weights = w.astype(np.float64).reshape(group, outputs, per_group, *kernel)
    letters = "abcdefgh"[:spatial]
    kernel_letters = "pqrstuvw"[:spatial]
    y = np.einsum(f"ngc{letters}{kernel_letters},goc{kernel_letters}->ngo{letters}", windows, weights, optimize=True)
    return y.reshape(batch, group * outputs, *out_shape).astype(np.int64)


def _pads(auto_pad: str, x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
          pads: Sequence[int] | None) -> list[int]:
    spatial = x.ndim - 2
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        return begin + end
    if auto_pad == "VALID" or pads is None:
        return [0] * (2 * spatial)
    return list(pads)


def _shifted(values: np.ndarray, zero_point: np.ndarray | None, axis_len: int | None = None) -> np.ndarray:
    """``values`` as int64 minus its zero point (per output channel where ``axis_len`` channels match it)."""
    out = values.astype(np.int64)
    if zero_point is None:
        return out
    zero_point = np.asarray(zero_point).astype(np.int64)
    if axis_len is not None and zero_point.ndim == 1 and zero_point.size == axis_len and axis_len > 1:
        zero_point = zero_point.reshape(-1, *([1] * (out.ndim - 1)))
    return out - zero_point


def _conv_arguments(op: OpRun, x: np.ndarray, w: np.ndarray, attributes: dict[str, Any]) -> dict[str, Any]:
    kernel = attributes.get("kernel_shape") or op.kernel_shape or w.shape[2:]
    strides = attributes.get("strides") or op.strides or [1] * (x.ndim - 2)
    dilations = attributes.get("dilations") or op.dilations or [1] * (x.ndim - 2)
    pads = _pads(attributes.get("auto_pad") or op.auto_pad or "NOTSET", x, kernel, strides, dilations,
                 attributes.get("pads") or op.pads)
    return {"group": attributes.get("group") or op.group or 1, "pads": pads, "strides": strides, "dilations": dilations}


def _requantized(accumulated: np.ndarray, multiplier: np.ndarray, zero_point: np.ndarray | None,
                 dtype: np.dtype) -> np.ndarray:
    """ONNX's reference requantisation: scaled, the zero point added, rounded half to even, saturated."""
    values = accumulated * multiplier
    if zero_point is not None:
        values = values + zero_point
    info = np.iinfo(dtype)
    return np.clip(np.rint(values), info.min, info.max).astype(dtype)


class MatMulInteger(OpRun):
    def _run(self, a, b, a_zero_point=None, b_zero_point=None):  # type: ignore[no-untyped-def]
        return (exact_matmul(_shifted(a, a_zero_point), _shifted(b, b_zero_point)).astype(np.int32),)


class QLinearMatMul(OpRun):
    def _run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):  # type: ignore[no-untyped-def]
        accumulated = exact_matmul(_shifted(a, a_zero_point), _shifted(b, b_zero_point))
        dtype = y_zero_point.dtype if y_zero_point is not None else a.dtype
        return (_requantized(accumulated, a_scale * b_scale / y_scale, y_zero_point, dtype),)


class ConvInteger(OpRun):
    def _run(self, x, w, x_zero_point=None, w_zero_point=None, **attributes):  # type: ignore[no-untyped-def]
        arguments = _conv_arguments(self, x, w, attributes)
        return (exact_conv(_shifted(x, x_zero_point), _shifted(w, w_zero_point, w.shape[0]), **arguments)
                .astype(np.int32),)


class QLinearConv(OpRun):
    def _run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None,  # type: ignore[no-untyped-def]
             **attributes):
        arguments = _conv_arguments(self, x, w, attributes)
        accumulated = exact_conv(_shifted(x, x_zero_point), _shifted(w, w_zero_point, w.shape[0]), **arguments)
        if B is not None:
            accumulated = accumulated + B.astype(np.int64).reshape(1, -1, *([1] * (x.ndim - 2)))
        if np.size(w_scale) > 1:
            w_scale = np.asarray(w_scale).reshape(1, -1, *([1] * (x.ndim - 2)))
        dtype = y_zero_point.dtype if y_zero_point is not None else x.dtype
        return (_requantized(accumulated.astype(np.int32), x_scale * w_scale / y_scale, y_zero_point, dtype),)


EXACT_OPS = [MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv]
FIRST_REFERENCE_DEQUANTIZE = 19  # onnx's reference evaluator implements DequantizeLinear from opset 19 on


def _older_dequantize() -> type[OpRun]:
    """``DequantizeLinear`` for opsets 10 to 18, which onnx's reference evaluator no longer implements: opset 19's,
    whose semantics on their types (int8, uint8, int32; per tensor, per axis from 13) are the same; 19 added only
    float8 types."""
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_19

    def run(self, x, x_scale, x_zero_point=None, axis=1, **newer):  # type: ignore[no-untyped-def]
        return DequantizeLinear_19._run(self, x, x_scale, x_zero_point, axis)  # newer: the latest schema's attributes

    return type("DequantizeLinear", (DequantizeLinear_19,), {"op_domain": "", "_run": run})


def evaluate_exact(model: onnx.ModelProto, batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The graph's outputs over ``batches`` by ONNX's reference evaluator, integer accumulations exact, at any
    opset from 10 on."""
    from onnx.reference import ReferenceEvaluator

    opset = next((entry.version for entry in model.opset_import if (entry.domain or "") in ("", "ai.onnx")), 0)
    ops = [*EXACT_OPS, _older_dequantize()] if opset < FIRST_REFERENCE_DEQUANTIZE else EXACT_OPS
    evaluator = ReferenceEvaluator(model, new_ops=ops)
    names = [output.name for output in model.graph.output]
    return joined([dict(zip(names, evaluator.run(None, dict(batch)))) for batch in batches], batches)
