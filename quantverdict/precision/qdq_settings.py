"""A Q/DQ recipe's settings as a manifest or a command line gives them, parsed and checked."""
from __future__ import annotations

from typing import Any

from quantverdict.errors import CalibrationError


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
