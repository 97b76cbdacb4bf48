"""TensorRT's calibration-cache text format, for TensorRT 10 implicit INT8 and ONNX Runtime's
TensorRT execution provider.

Line 1 is ``TRT-<version>-<algorithm>``; every other line is ``<tensor>: <scale>`` with the
scale (amax / 127) written as the big-endian hex of its float32 bits.
"""
from __future__ import annotations

import struct
from typing import Mapping

from quantverdict.errors import CalibrationError

HEADER = "TRT-{version}-EntropyCalibration2"
INT8_MAX = 127.0


def to_trt_cache(ranges: Mapping[str, float], version: str = "100900") -> str:
    lines = [HEADER.format(version=version)]
    for name, amax in ranges.items():
        lines.append(f"{name}: {struct.pack('>f', float(amax) / INT8_MAX).hex()}")
    return "\n".join(lines) + "\n"


def from_trt_cache(text: str) -> dict[str, float]:
    """Parse a cache back into per-tensor amax; a malformed line is named."""
    lines = text.strip().splitlines()
    if not lines or not lines[0].startswith("TRT-"):
        raise CalibrationError("not a TensorRT calibration cache: first line must start with 'TRT-'")
    ranges = {}
    for number, line in enumerate(lines[1:], start=2):
        name, sep, hexed = line.rpartition(": ")
        try:
            if not sep:
                raise ValueError("no ': ' separator")
            ranges[name] = struct.unpack(">f", bytes.fromhex(hexed))[0] * INT8_MAX
        except (ValueError, struct.error) as exc:
            raise CalibrationError(f"TensorRT calibration cache line {number} {line!r}: {exc}") from exc
    return ranges
