"""The quantized number formats the Q/DQ recipes write (INT8, FP8 E4M3) and their symmetric scales: the
one scale rule of activations and weights (amax / qmax, a zero range kept finite)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from onnx import TensorProto


@dataclass(frozen=True)
class QuantFormat:
    """A quantized element type and the magnitude its scale maps the calibrated range onto."""

    name: str
    onnx_type: int
    qmax: float
    np_type: Any
    min_opset: int  # per-axis DequantizeLinear: 13; float8 QuantizeLinear/DequantizeLinear: 19

    def scale(self, amax: Any) -> np.ndarray:
        """The symmetric scale that maps ``amax`` (a range, or one per channel) onto ``qmax``, as float32; a
        range of zero gets a tiny scale instead of a division by zero."""
        return np.asarray(np.maximum(amax, 1e-12) / self.qmax, dtype=np.float32)

    def quantize(self, scaled: np.ndarray) -> np.ndarray:
        """Round values already divided by their scale, as ONNX QuantizeLinear would."""
        clipped = np.clip(scaled, -self.qmax, self.qmax)
        if self.onnx_type == TensorProto.INT8:
            return np.rint(clipped).astype(np.int8)  # rint: half to even, like QuantizeLinear
        return clipped.astype(self.np_type)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Unpickled as this module's own format (a worker process's recipe): recipes tell formats apart by identity."""
        return _named, (self.name,)


INT8 = QuantFormat("int8", TensorProto.INT8, 127.0, np.int8, 13)
FP8_E4M3 = QuantFormat("fp8", TensorProto.FLOAT8E4M3FN, 448.0, ml_dtypes.float8_e4m3fn, 19)


def _named(name: str) -> QuantFormat:
    return {fmt.name: fmt for fmt in (INT8, FP8_E4M3)}[name]


def stored_format(onnx_type: int) -> QuantFormat:
    """The format whose values a tensor of ``onnx_type`` stores (a quantized weight's)."""
    return {fmt.onnx_type: fmt for fmt in (INT8, FP8_E4M3)}[onnx_type]


def weight_scales(values: np.ndarray, axis: int | None, fmt: QuantFormat) -> np.ndarray:
    """A weight's symmetric scales: one per output channel along ``axis`` (the other axes kept with size
    1, so they broadcast against the weight), or one for the whole tensor where ``axis`` is None."""
    reduce = None if axis is None else tuple(i for i in range(values.ndim) if i != axis)
    return fmt.scale(np.abs(values).max(axis=reduce, keepdims=axis is not None))
