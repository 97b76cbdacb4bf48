"""Fixtures shared by the test modules (the harness's own fixtures live in its pytest plugin)."""
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, settings

# ``ci``: few, derandomised examples and no deadline (model builds are slow); ``nightly``: deep. Registered
# here, before Hypothesis's plugin reads --hypothesis-profile (pytest.ini selects ``ci``).
_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
settings.register_profile("ci", max_examples=12, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("nightly", max_examples=300, **_COMMON)


@pytest.fixture
def ort_quantize_static() -> Callable[..., None]:
    """ONNX Runtime's own post-training quantization over a list of batches (a comparison point)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self, batches: list) -> None:
            self.items = iter(batches)

        def get_next(self) -> Any:
            return next(self.items, None)

    def run(source: Path, target: Path, batches: list, **options: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_static(str(source), str(target), Reader(batches), quant_format=QuantFormat.QDQ, **options)

    return run
