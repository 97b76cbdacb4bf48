"""The CPU INT8 speed lane: ONNX Runtime's own layout, which its CPU kernels fuse into integer
operators, and which stays within the INT8 tolerance (the TensorRT-layout graph stays the accuracy
reference; the lane's speed is a benchmark floor in fixtures/speedups.yaml)."""
from collections import Counter

import onnx
import pytest

from quantverdict.backends.onnxrt import OnnxRuntimeRunner, integer_kernel_config
from quantverdict.backends import infer_all
from quantverdict.judge.compare import compare
from quantverdict.precision import get_recipe

pytestmark = [pytest.mark.int8, pytest.mark.onnxruntime]


def test_the_cpu_lane_graph_is_made_of_node_units_that_onnxruntime_fuses(qv_pipeline, tmp_path):
    import onnxruntime

    recipe = get_recipe("int8").for_target("onnxruntime-cpu")
    assert recipe.params()["layout"] == "QDQ node units" and get_recipe("fp8").for_target("onnxruntime-cpu").name == "fp8"
    path = qv_pipeline.store.precision_onnx("resblock", recipe)
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    convs = [node for node in graph.node if node.op_type == "Conv"]
    assert convs and all(producer[node.input[0]].op_type == "DequantizeLinear" for node in convs)
    zero_points = {init.name: init for init in graph.initializer}
    activation_q = [node for node in graph.node if node.op_type == "QuantizeLinear"]
    assert {zero_points[q.input[2]].data_type for q in activation_q} == {onnx.TensorProto.UINT8}
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "fused.onnx")
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    fused = Counter(node.op_type for node in onnx.load(str(tmp_path / "fused.onnx")).graph.node)
    assert fused["QLinearConv"] > 0 and fused["QLinearConv"] + fused["Conv"] == len(convs), fused  # integer kernels


@pytest.mark.parametrize("model", ["resblock", "digits-cnn"])
def test_the_cpu_lane_stays_within_the_int8_tolerance(qv_pipeline, model):
    spec = qv_pipeline.models.get(model)
    path = qv_pipeline.store.precision_onnx(model, get_recipe("int8").for_target("onnxruntime-cpu"))
    with OnnxRuntimeRunner(path, ["CPUExecutionProvider"], True, integer_kernel_config()) as runner:
        outputs = infer_all(runner, qv_pipeline.store.eval_batches(model))
    tolerance = qv_pipeline.tolerances.resolve(model, "int8", spec.tolerances)
    result = compare(qv_pipeline.store.reference(model), outputs, tolerance, spec.task == "classification")
    assert result.passed, result.explain()
