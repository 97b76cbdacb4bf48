"""INT8 laid out for ONNX Runtime's CPU integer kernels: a speed target, not the accuracy reference.

The harness's INT8 graph is TensorRT's layout (symmetric signed activations, Q/DQ at each
consumer's inputs only), which ONNX Runtime's CPU provider cannot fuse into its fast kernels: it
runs slower than FP32 there. ONNX Runtime's own post-training quantizer writes the layout its
kernels fuse: QDQ node units (DequantizeLinear on every input, QuantizeLinear on the output) around
each operator, unsigned 8-bit activations with a zero point and signed 8-bit weights per channel
(U8S8, VNNI's dot product). This recipe runs that quantizer (``quantize_static``, MinMax) over the
harness's calibration batches, so the CPU speed lane times what ONNX Runtime users deploy; the
TensorRT-layout graph stays what INT8 accuracy is judged on.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Sequence

import onnx

from quantverdict.models.spec import Batch
from quantverdict.precision.base import Recipe
from quantverdict.precision.coverage import left_by

TARGET = "onnxruntime-cpu"


class OrtCpuInt8(Recipe):
    name = "int8"
    quantized = True
    calibration_data = True  # ONNX Runtime's quantizer calibrates it from the batches
    # its per-channel weights: DequantizeLinear's axis (opset 13), which quantize_static writes into a graph of any
    # opset (an opset-11 export's graph then fails ONNX's checker: "Unrecognized attribute: axis")
    min_opset = 13

    def params(self) -> dict[str, Any]:
        from quantverdict.capabilities import package_version

        return {**super().params(), "layout": "QDQ node units", "activations": "uint8 asymmetric (MinMax)",
                "weights": "int8 symmetric per channel", "quantizer": f"onnxruntime {package_version('onnxruntime')}"}

    def float_reasons(self, source: onnx.ModelProto) -> dict[str, str]:
        return left_by(source, "ONNX Runtime's quantize_static")

    def apply_batches(self, model: onnx.ModelProto, batches: Sequence[Batch]) -> onnx.ModelProto:
        """``model`` quantized by ONNX Runtime's ``quantize_static`` over ``batches``."""
        from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                              quantize_static)

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.items = iter(batches)

            def get_next(self) -> Any:
                return next(self.items, None)

        with tempfile.TemporaryDirectory() as folder:
            source, target = Path(folder) / "fp32.onnx", Path(folder) / "int8.onnx"
            onnx.save(model, str(source))
            previous = logging.root.manager.disable
            logging.disable(logging.WARNING)  # the quantizer logs its advice to pre-process the model each call
            try:
                quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                                calibrate_method=CalibrationMethod.MinMax)
            finally:
                logging.disable(previous)
            quantized = onnx.load(str(target))
        onnx.checker.check_model(quantized)
        return quantized
