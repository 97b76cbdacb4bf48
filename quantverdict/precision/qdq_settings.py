"""A Q/DQ recipe's settings as a manifest or a command line gives them, parsed and checked."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from quantverdict.errors import CalibrationError
from quantverdict.precision.base import Recipe
from quantverdict.precision.calibrators import Calibrator
from quantverdict.precision.grids import INT8, QuantFormat
from quantverdict.precision.wider_layers import wider_formats


def optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def share(value: Any) -> float | None:
    if value is None:
        return None
    part = float(value)
    if not 0 < part < 1:
        raise CalibrationError(f"fallback {value!r}: expected a share of the layers between 0 and 1 (e.g. 0.1)")
    return part


def patterns(value: Any) -> tuple[str, ...]:
    """Node-name patterns from a list, or from one string separated by ``;`` (a command line's value)."""
    items = value.split(";") if isinstance(value, str) else value
    return tuple(str(item).strip() for item in items if str(item).strip())


# a setting's name → the QDQOptions field it sets, and how its value is read
SETTINGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "calibration": ("calibrator", Calibrator), "smoothquant": ("smoothquant", optional_float),
    "equalize": ("equalize", bool), "exclude": ("exclude", patterns), "gptq": ("gptq", bool),
    "bias_correction": ("bias_correction", bool), "fallback": ("fallback", share),
    "fallback_format": ("fallback_format", wider_formats)}


def other_quantizer(name: str, fmt: QuantFormat, quantizer: str, settings: Mapping[str, Any]) -> Recipe:
    """The recipe of a ``quantizer`` other than the harness's own: NVIDIA Model Optimizer's ONNX PTQ (its own placement
    and calibration) or ONNX Runtime's quantize_static (INT8 only), with a calibration setting at most."""
    if set(settings) - {"calibration"}:
        raise CalibrationError(f"quantizer {quantizer!r} takes only a calibration setting; got {sorted(settings)}")
    if quantizer == "modelopt":
        from quantverdict.precision.modelopt import ModelOptimizerQDQ

        return ModelOptimizerQDQ(name, settings.get("calibration"))
    if quantizer == "onnxruntime" and fmt is INT8 and not settings:
        from quantverdict.precision.ort_cpu import OrtCpuInt8

        return OrtCpuInt8()
    raise CalibrationError(f"unknown {name} quantizer {quantizer!r} (with {dict(settings)}); "
                           "known: harness, modelopt, onnxruntime (int8, its own MinMax calibration)")
