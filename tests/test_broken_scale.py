"""A deliberately broken INT8 model must fail its tolerance, loudly and specifically."""
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from quantverdict.backends import infer_all
from quantverdict.judge.compare import compare
from quantverdict.precision import get_recipe


@pytest.mark.int8
@pytest.mark.onnxruntime
def test_int8_with_one_scale_times_100_violates_tolerance(qv_pipeline, tmp_path):
    from quantverdict.backends.onnxrt import OnnxRuntimeRunner

    good = onnx.load(str(qv_pipeline.store.precision_onnx("cnn", get_recipe("int8"))))
    scale = next(init for init in good.graph.initializer if init.name.endswith("_scale")
                 and init.name.startswith("input"))
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 100, scale.name))
    broken = tmp_path / "cnn-int8-broken.onnx"
    onnx.save(good, str(broken))

    with OnnxRuntimeRunner(broken, ["CPUExecutionProvider"], optimize=True) as runner:
        candidate = infer_all(runner, qv_pipeline.store.eval_batches("cnn"))
    tolerance = qv_pipeline.tolerances.resolve("cnn", "int8", {})
    result = compare(qv_pipeline.store.reference("cnn"), candidate, tolerance, classification=True)

    assert not result.passed
    message = result.explain()
    assert "logits: cosine = " in message and f"must be ≥ {tolerance.min_cosine:g}" in message
    assert "logits: worst elements [" in message
    cosine = result.metrics["logits"]["cosine"]
    assert cosine < tolerance.min_cosine and np.isfinite(cosine)


@pytest.mark.int8
@pytest.mark.onnxruntime
def test_first_diverging_layer_is_the_consumer_of_the_broken_scale(qv_pipeline, tmp_path):
    from quantverdict.judge.diagnose import first_divergence

    model = onnx.load(str(qv_pipeline.store.precision_onnx("cnn", get_recipe("int8"))))
    scale = next(init for init in model.graph.initializer if init.name == "/2/MaxPool_output_0_scale")
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 100, scale.name))
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    found = first_divergence(qv_pipeline.store.fp32_onnx("cnn"), broken, qv_pipeline.store.eval_batches("cnn")[0], 0.99)
    assert found is not None and (found["node"], found["op"]) == ("/3/Conv", "Conv") and found["cosine"] < 0.99
    intact = qv_pipeline.store.precision_onnx("cnn", get_recipe("int8"))
    assert first_divergence(qv_pipeline.store.fp32_onnx("cnn"), intact, qv_pipeline.store.eval_batches("cnn")[0], 0.99) is None


@pytest.mark.int8
@pytest.mark.onnxruntime
def test_the_runtimes_first_divergence_is_the_first_int8_quantizer_past_the_bound(tmp_path):
    """ONNX Runtime with optimisations on, each INT8 quantizer's codes against the graph's as written (read in one
    pass): a faithful runtime moves none by two steps on more than half its elements (the backend's diagnosis says
    so as its search starts, and nothing when it reads it from the cache), and with a bound below zero the first
    quantizer in the graph's order is the one named, its producer and the share of its codes that moved."""
    from quantverdict.backends.onnxrt import OnnxRuntimeRunner
    from quantverdict.backends.onnxrt_divergence import first_runtime_divergence
    from quantverdict.run.pipeline import Pipeline

    pipeline = Pipeline(tmp_path / "cache")
    artifacts = pipeline.executor.artifacts("cnn", "int8", "onnxruntime")
    batch = pipeline.store.eval_batches("cnn")[0]
    said: list[str] = []
    for _ in range(2):
        assert pipeline.backend("onnxruntime").diagnose(artifacts, batch, 0.5, pipeline.caps, said.append).divergence \
            is None
    assert said == ["finding the first INT8 tensor where onnxruntime's fused kernels leave the graph's codes"]
    path = artifacts.onnx_path()
    graph = onnx.load(str(path))
    producers = {name: node for node in graph.graph.node for name in node.output}
    int8 = {init.name for init in graph.graph.initializer if init.data_type == onnx.TensorProto.INT8}
    first = next(node for node in graph.graph.node if node.op_type == "QuantizeLinear" and node.input[2] in int8)
    found = first_runtime_divergence(path, batch, -1.0, lambda graph: OnnxRuntimeRunner(
        graph, ["CPUExecutionProvider"], optimize=True))
    source = producers.get(first.input[0])
    assert found is not None and found["tensor"] == first.input[0]
    named = (source.name, source.op_type) if source else (first.input[0], "graph input")
    assert (found["node"], found["op"]) == named
    assert 0.0 <= found["fraction"] <= 0.5 and found["max_steps"] >= 0


def test_first_divergence_skips_constants_and_never_reports_nan(tmp_path):
    """A Constant node (and a tensor computed from it alone) is never the diverging layer; a tensor that
    is all zeros on one side is judged by relative error, not by an undefined cosine."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from quantverdict.export.compat import make_model
    from quantverdict.judge.diagnose import first_divergence

    def graph(mask_value: float, gate_scale: float) -> Path:
        nodes = [helper.make_node("Constant", [], ["mask"], value=numpy_helper.from_array(np.full((1, 4), mask_value,
                                                                                                   np.float32))),
                 helper.make_node("Mul", ["mask", "two"], ["mask2"], name="mask_scale"),  # constant, computed
                 helper.make_node("Mul", ["x", "mask2"], ["masked"], name="apply_mask"),
                 helper.make_node("Mul", ["x", "gate"], ["gated"], name="gate"),
                 helper.make_node("Add", ["masked", "gated"], ["y"], name="out")]
        model = make_model(helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
            [numpy_helper.from_array(np.float32(2.0), "two"),
             numpy_helper.from_array(np.full((1, 4), gate_scale, np.float32), "gate")]), opset=19)
        path = tmp_path / f"g-{mask_value}-{gate_scale}.onnx"
        onnx.save(model, str(path))
        return path

    batch = {"x": np.arange(1, 9, dtype=np.float32).reshape(2, 4)}
    reference = graph(0.0, 1.0)
    masked_differently = first_divergence(reference, graph(1.0, 1.0), batch, 0.99)
    assert masked_differently["node"] == "apply_mask" and "FP32 is all zeros here" in masked_differently["summary"]
    assert not np.isnan(masked_differently["relative_error"])
    gate_flipped = first_divergence(reference, graph(0.0, -1.0), batch, 0.99)
    assert gate_flipped["node"] == "gate" and gate_flipped["cosine"] < 0  # zeros equal on both sides: skipped
    assert first_divergence(reference, graph(0.0, 1.0), batch, 0.99) is None
