"""A deliberately broken INT8 model must fail its tolerance, loudly and specifically."""
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from harness.judge.compare import compare, concat
from harness.precision import get_recipe


@pytest.mark.int8
@pytest.mark.onnxruntime
def test_int8_with_one_scale_times_100_violates_tolerance(harness_pipeline, tmp_path):
    from harness.backends.onnxrt import OnnxRuntimeRunner

    good = onnx.load(str(harness_pipeline.store.precision_onnx("cnn", get_recipe("int8"))))
    scale = next(init for init in good.graph.initializer if init.name.endswith("_scale")
                 and init.name.startswith("input"))
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 100, scale.name))
    broken = tmp_path / "cnn-int8-broken.onnx"
    onnx.save(good, str(broken))

    with OnnxRuntimeRunner(broken, ["CPUExecutionProvider"], optimize=True) as runner:
        candidate = concat([runner.infer(b) for b in harness_pipeline.store.eval_batches("cnn")])
    tolerance = harness_pipeline.tolerances.resolve("cnn", "int8", {})
    result = compare(harness_pipeline.store.reference("cnn"), candidate, tolerance, classification=True)

    assert not result.passed
    message = result.explain()
    assert "logits: cosine = " in message and f"must be ≥ {tolerance.min_cosine:g}" in message
    assert "logits: worst elements [" in message
    cosine = result.metrics["logits"]["cosine"]
    assert cosine < tolerance.min_cosine and np.isfinite(cosine)


@pytest.mark.int8
@pytest.mark.onnxruntime
def test_first_diverging_layer_is_the_consumer_of_the_broken_scale(harness_pipeline, tmp_path):
    from harness.judge.diagnose import first_divergence

    model = onnx.load(str(harness_pipeline.store.precision_onnx("cnn", get_recipe("int8"))))
    scale = next(init for init in model.graph.initializer if init.name == "/2/MaxPool_output_0_scale")
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 100, scale.name))
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    found = first_divergence(harness_pipeline.store.fp32_onnx("cnn"), broken, harness_pipeline.store.eval_batches("cnn")[0], 0.99)
    assert found is not None and (found["node"], found["op"]) == ("/3/Conv", "Conv") and found["cosine"] < 0.99
    intact = harness_pipeline.store.precision_onnx("cnn", get_recipe("int8"))
    assert first_divergence(harness_pipeline.store.fp32_onnx("cnn"), intact, harness_pipeline.store.eval_batches("cnn")[0], 0.99) is None
