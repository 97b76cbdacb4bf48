"""Layers quantized alone are ranked with their float nodes optimised (their Q/DQ as written), so their errors are
their graphs' as written up to the float kernels' rounding, not bit for bit."""
from typing import Mapping

import numpy as np

from quantverdict.judge.layer_errors import Errors, per_sample

# How far under the signal the float kernels' rounding stays: float32's 24-bit significand (-144 dB an operation)
# compounded over a network's depth and sums, and a value an ulp from a quantizer's rounding boundary rounding the
# other way (as between two CPUs' kernels as written). Measured: 104-148 dB (MobileNetV2, MobileNetV3, the built-ins).
FLOAT_FLOOR_DB = 90.0


def assert_errors_agree(found: Errors, expected: Errors, reference: Mapping[str, np.ndarray], what: object) -> None:
    """``found``'s error, pooled over the samples on each output, is ``expected``'s within :data:`FLOAT_FLOOR_DB` under
    the signal of ``reference``: by the triangle inequality, their norms differ by no more than the outputs do."""
    for name in expected.sums:
        signal = float(np.sum(per_sample(reference[name]).astype(np.float64) ** 2))
        ours, theirs = (float(np.sum(errors.noise(name))) ** 0.5 for errors in (found, expected))
        assert abs(ours - theirs) <= (signal * 10 ** (-FLOAT_FLOOR_DB / 10)) ** 0.5, (what, name, ours, theirs, signal)
