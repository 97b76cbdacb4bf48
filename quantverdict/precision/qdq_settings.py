"""The Q/DQ recipes of quantizers other than the harness's own, as a recipe's ``quantizer`` setting picks them."""
from __future__ import annotations

from quantverdict.errors import CalibrationError
from quantverdict.precision.base import Recipe
from quantverdict.precision.grids import INT8, QuantFormat
from quantverdict.precision.settings import RecipeSettings


def other_quantizer(name: str, fmt: QuantFormat, settings: RecipeSettings) -> Recipe:
    """The recipe of a ``quantizer`` other than the harness's own: NVIDIA Model Optimizer's ONNX PTQ (its own placement
    and calibration) or ONNX Runtime's quantize_static (INT8 only), with a calibration setting at most."""
    quantizer, others = settings.quantizer, settings.unset("quantizer")
    if others.unset("calibration"):
        raise CalibrationError(f"quantizer {quantizer!r} takes only a calibration setting; "
                               f"got {sorted(others.given())}")
    if quantizer == "modelopt":
        from quantverdict.precision.modelopt import ModelOptimizerQDQ

        return ModelOptimizerQDQ(name, others.calibration or None)
    if quantizer == "onnxruntime" and fmt is INT8 and not others:
        from quantverdict.precision.ort_cpu import OrtCpuInt8

        return OrtCpuInt8()
    raise CalibrationError(f"unknown {name} quantizer {quantizer!r} (with {others.to_dict()}); "
                           "known: harness, modelopt, onnxruntime (int8, its own MinMax calibration)")
