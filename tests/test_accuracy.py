"""The accuracy matrix: every model × precision × backend the plugin parametrizes.

Select with markers (``pytest -m int8``, ``-m "onnxruntime and not slow"``) or the plugin's
options (``--models resnet18,cnn --precisions int8``).
"""
import pytest


def test_accuracy(case, qv_pipeline, record_case):
    result = qv_pipeline.run(case)
    record_case(result)
    if result.status == "skipped":
        pytest.skip(result.message)
    assert result.status == "passed", result.message
