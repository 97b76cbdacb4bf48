"""A Q/DQ recipe's settings as a manifest or a command line gives them, parsed and checked."""
from __future__ import annotations

from typing import Any, Callable

from quantverdict.errors import CalibrationError
from quantverdict.precision.calibrators import Calibrator
from quantverdict.precision.wider_layers import wider_format


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
    "fallback_format": ("fallback_format", wider_format)}
