"""The nodes a Q/DQ recipe writes: a QuantizeLinear → DequantizeLinear pair on an activation, and a weight stored in
the format with its DequantizeLinear (:class:`quantverdict.precision.qdq.QDQ` places them)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantverdict.precision.grids import QuantFormat, weight_scales


def zero_point(fmt: QuantFormat, name: str, count: int | None) -> onnx.TensorProto:
    """Zeros in ``fmt``: one, or ``count`` (per channel)."""
    return numpy_helper.from_array(np.zeros(count or (), dtype=fmt.np_type), name)


def activation_qdq(graph: onnx.GraphProto, fmt: QuantFormat, tensor: str, tag: str, amax: float,
                   consumers: list[tuple[onnx.NodeProto, list[int]]]) -> list[onnx.NodeProto]:
    """One Q/DQ pair on ``tensor`` (its names tagged with ``tag``), feeding the given inputs of its quantized
    consumers (a residual Add's input from a convolution keeps the float tensor)."""
    base = f"{tensor}{tag}"
    names = {k: f"{base}_{k}" for k in ("scale", "zero_point", "quantized", "dequantized")}
    graph.initializer.extend([numpy_helper.from_array(fmt.scale(float(amax)), names["scale"]),
                              zero_point(fmt, names["zero_point"], None)])
    for node, indices in consumers:
        for index in indices:
            node.input[index] = names["dequantized"]
    return [
        helper.make_node("QuantizeLinear", [tensor, names["scale"], names["zero_point"]],
                         [names["quantized"]], name=f"{base}_QuantizeLinear"),
        helper.make_node("DequantizeLinear", [names["quantized"], names["scale"], names["zero_point"]],
                         [names["dequantized"]], name=f"{base}_DequantizeLinear"),
    ]


def weight_dq(graph: onnx.GraphProto, fmt: QuantFormat, weight: onnx.TensorProto, axis: int | None,
              base: str) -> onnx.NodeProto:
    """``weight`` stored quantized as ``<base>_quantized`` with its scale and a DequantizeLinear giving
    ``<base>_dequantized``: one per quantized layer, even of one tied weight (ONNX Runtime's x64 U8S8 rewrite
    fails on a DequantizeLinear or a zero point two fused layers share: "Attempt to replace the existing
    tensor"), so GPTQ also rounds each copy for its own layer."""
    values = numpy_helper.to_array(weight).astype(np.float32)
    scales = weight_scales(values, axis, fmt)
    quantized = fmt.quantize(values / scales)
    scale = scales if axis is None else scales.reshape(-1)
    graph.initializer.extend([
        numpy_helper.from_array(quantized, f"{base}_quantized"),
        numpy_helper.from_array(scale, f"{base}_scale"),
        zero_point(fmt, f"{base}_zero_point", None if axis is None else scale.size),
    ])
    extra = {} if axis is None else {"axis": axis}
    return helper.make_node("DequantizeLinear", [f"{base}_quantized", f"{base}_scale", f"{base}_zero_point"],
                            [f"{base}_dequantized"], name=f"{base}_DequantizeLinear", **extra)
