"""Weighted layers inside an ``If``'s branches (a choice the data makes at run time) quantized as top-level ones are:
each branch calibrated on the batches that take it, Q/DQ placed in its body, the case judged on every layer."""
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantverdict.precision.bodies import branch_ranges, branches, flattened
from quantverdict.precision.calibrate import calibrate, held_values
from quantverdict.precision.calibrators import Calibrator
from quantverdict.cache import Cache
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.grids import INT8
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline
from test_before_search import _branches, _manifest


def _batches(sign: float, gain: float, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Batches whose every sum has ``sign`` (so all take one branch of :func:`_branches`' If), of magnitude ``gain``."""
    rng = np.random.default_rng(seed)
    return [{"x": (sign * np.abs(rng.normal(0, gain, (4, 8)))).astype(np.float32)} for _ in range(count)]


def _run(model: onnx.ModelProto, batch: dict) -> np.ndarray:
    return _run_all(model, batch)[0]


def _run_all(model: onnx.ModelProto, batch: dict) -> list[np.ndarray]:
    """Every output of ``model`` on ``batch``, as written (ONNX Runtime's optimisations off)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, batch)


def test_a_flattened_branch_computes_what_the_if_computes_where_it_takes_it():
    model = _branches()
    [(node, _, _), _] = list(branches(model))
    for attribute, sign in (("then_branch", 1.0), ("else_branch", -1.0)):
        batch = _batches(sign, 1.0, 1, 3)[0]
        assert np.array_equal(_run(flattened(model, node, attribute), batch), _run(model, batch))


def test_each_branch_is_calibrated_on_the_batches_that_take_it(tmp_path):
    """Positive batches (small) take ``then``, negative ones (five times larger) ``else``: each branch's input range
    is the max of its own batches, to the bit; a branch no batch takes is calibrated on every batch."""
    model, cache = _branches(), Cache(tmp_path / "cache")
    small, large = _batches(1.0, 1.0, 3, 1), _batches(-1.0, 5.0, 3, 2)
    recipe = QDQ(INT8).configured({"calibration": "max"})
    measure = lambda graph, names, batches: calibrate(cache, graph, names, batches, Calibrator("max"))  # noqa: E731
    ranges = branch_ranges(model, recipe.calibration_recipe().tensors_to_calibrate, small + large, measure, held_values)
    assert set(ranges) == {"by_sign/then_branch/x", "by_sign/else_branch/x"}
    assert ranges["by_sign/then_branch/x"] == calibrate(cache, model.SerializeToString(), ["x"], small,
                                                        Calibrator("max"))["x"]
    assert ranges["by_sign/else_branch/x"] == calibrate(cache, model.SerializeToString(), ["x"], large,
                                                        Calibrator("max"))["x"]
    assert ranges["by_sign/then_branch/x"] < ranges["by_sign/else_branch/x"] / 2
    only_then = branch_ranges(model, recipe.calibration_recipe().tensors_to_calibrate, small, measure, held_values)
    assert only_then["by_sign/else_branch/x"] == only_then["by_sign/then_branch/x"]  # untaken: every batch


@pytest.mark.int8
def test_a_network_whose_weights_live_in_an_ifs_branches_is_quantized_there_and_judged(tmp_path):
    """Every weight inside an ``If`` whose condition is data (before: failed at 0 of 2 layers, and ONNX Runtime's own
    ``quantize_static`` writes no Q/DQ there either): both branches quantized, searched and judged at 2 of 2."""
    path = tmp_path / "branches.onnx"
    onnx.save(_branches(), str(path))
    pipeline = Pipeline(tmp_path / "cache", manifest=_manifest(tmp_path, "branches", path,
                                                               "[{name: x, shape: [4, 8]}]", ["y"]))
    result = pipeline.run(Case("branches", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    coverage = result.metrics["coverage"]
    assert coverage["quantized"] == coverage["layers"] == 2, coverage
    built = onnx.load(str(pipeline.store.precision_onnx("branches", pipeline.recipes.recipe("branches", "int8",
                                                                                             "emulated"))))
    for _, attribute, body in branches(built):
        kinds = [node.op_type for node in body.node]
        assert kinds.count("QuantizeLinear") == 1 and kinds.count("DequantizeLinear") == 2, (attribute, kinds)


@pytest.mark.int8
def test_a_voice_detector_whose_rate_is_data_is_quantized_in_both_branches(tmp_path):
    """The sample rate a 0-d input, not fixed: the If stays, and both rates' layers (4 of 4) run in INT8, the 8 kHz
    branch reading the rate inside its body too."""
    from test_before_search import _by_rate

    path = tmp_path / "vad.onnx"
    onnx.save(_by_rate(), str(path))
    inputs = "[{name: x, shape: [4, 8]}, {name: sr, shape: [], dtype: int64, range: [8000, 16001]}]"
    pipeline = Pipeline(tmp_path / "cache", manifest=_manifest(tmp_path, "vad", path, inputs, ["y"]))
    result = pipeline.run(Case("vad", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    coverage = result.metrics["recipe"]["coverage"]
    assert (coverage["quantized"], coverage["layers"]) == (4, 4), coverage
    assert "If" in {node.op_type for node in onnx.load(str(pipeline.store.fp32_onnx("vad"))).graph.node}


ROUTER = """import torch
from torch import nn


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.loud = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        self.quiet = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        if bool(x.abs().mean() > 1.0):
            return self.loud(x)
        return self.quiet(x)


def net():
    return torch.jit.script(Router().eval())
"""


@pytest.mark.int8
def test_a_torchscript_branch_on_the_data_is_quantized_in_both_branches(tmp_path, monkeypatch, qv_pipeline):
    """torch's TorchScript exporter writes a Python ``if`` on the data as an ``If`` whose branches hold the Linear
    layers (and their weights as outer initializers): all four run in INT8, the branch each batch takes calibrated on
    it."""
    import warnings

    from user_repo import written

    written(tmp_path, monkeypatch, {"router.py": ROUTER, "models.yaml": textwrap.dedent("""\
        models:
          - name: router
            build: router:net
            build_files: []
            inputs: [{name: x, shape: [8, 32], range: [-3, 3]}]
            outputs: [logits]
            calibration: synthetic
        """)})
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=tmp_path / "models.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script's deprecation
        result = pipeline.run(Case("router", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    fp32 = onnx.load(str(pipeline.store.fp32_onnx("router")))
    assert [node.op_type for node in fp32.graph.node].count("If") == 1
    coverage = result.metrics["coverage"]
    assert coverage["quantized"] == coverage["layers"] == 4 and coverage["kinds"] == {"Gemm": [4, 4]}, coverage


def _detector() -> onnx.ModelProto:
    """A recurrent voice detector written as silero-vad's TorchScript export writes one (its graph is in the
    ``silero-vad`` wheel): every weight inside an ``If`` on the sample rate with two outputs (a probability and the
    recurrent state), and inside that branch an ``If`` on the data (TorchScript's batched or not) whose branches each
    hold only an LSTM, reading a tensor of the graph around them rather than an input of their own."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    OUT = (("p", [4, 1]), ("s", [4, 8]))  # the probability and the recurrent state, in the order the If gives them

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, 0.4, shape).astype(np.float32), name)

    def lstm(name: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("LSTM", ["seq", f"{name}_w", f"{name}_r"], ["", f"{name}_h"], hidden_size=8,
                              name=f"{name}_lstm"),
             helper.make_node("Squeeze", [f"{name}_h", "axis0"], [f"{name}_state"], name=f"{name}_squeeze")],
            name, [], [helper.make_tensor_value_info(f"{name}_state", TensorProto.FLOAT, [4, 8])],
            [weight(f"{name}_w", 1, 32, 16), weight(f"{name}_r", 1, 32, 8)])

    k16 = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_in"], ["h"], name="mm_in"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("Unsqueeze", ["r", "axis0"], ["seq"], name="as_sequence"),
         helper.make_node("If", ["positive"], ["s"], name="batched", then_branch=lstm("a"), else_branch=lstm("b")),
         helper.make_node("MatMul", ["s", "w_out"], ["logit"], name="mm_out"),
         helper.make_node("Sigmoid", ["logit"], ["p"], name="sigmoid")],
        "k16", [], [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in OUT],
        [weight("w_in", 8, 16), weight("w_out", 8, 1)])
    silent = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["p_shape"], ["p0"], name="p0"),
         helper.make_node("ConstantOfShape", ["s_shape"], ["s0"], name="s0")],
        "k8", [], [helper.make_tensor_value_info(f"{name}0", TensorProto.FLOAT, shape) for name, shape in OUT])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="total"),
             helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
             helper.make_node("Equal", ["sr", "rate16k"], ["is16k"], name="is16k"),
             helper.make_node("If", ["is16k"], ["p_out", "s_out"], name="by_rate", then_branch=k16,
                              else_branch=silent)]
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
                            helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, shape) for name, shape in OUT],
        [numpy_helper.from_array(np.array(16000, np.int64), "rate16k"),
         numpy_helper.from_array(np.array(0, np.float32), "zero"),
         numpy_helper.from_array(np.array([0], np.int64), "axis0"),
         *(numpy_helper.from_array(np.array(shape, np.int64), f"{name}_shape") for name, shape in OUT)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.int8
def test_a_detectors_rate_if_is_flattened_with_both_outputs_and_its_branch_lstms_run_in_int8(tmp_path):
    """Before: the rate fixed, onnx-graphsurgeon's flattening rebound the probability alone and the state lost its
    producer (the checker refused the graph); with that mended, the inner ``If`` was sorted before the node whose
    output its branches read, and its LSTM-only branches, having no ranges to calibrate, were left in float. Now the
    FP32 graph computes both outputs as the original does, and ``recurrent: dynamic`` runs all four layers in INT8."""
    path = tmp_path / "detector.onnx"
    onnx.save(_detector(), str(path))
    (tmp_path / "models.yaml").write_text(textwrap.dedent(f"""\
        models:
          - name: detector
            onnx: {path}
            inputs: [{{name: x, shape: [4, 8]}}, {{name: sr, shape: [], dtype: int64, value: 16000}}]
            outputs: [p_out, s_out]
            calibration: synthetic
            recipe: {{int8: {{recurrent: dynamic}}}}
        """))
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    flat = onnx.load(str(pipeline.store.fp32_onnx("detector")))
    assert [node.name for node in flat.graph.node if node.op_type == "If"] == ["batched"]
    for sign in (1.0, -1.0):  # each branch of the inner If
        feed = {"x": _batches(sign, 1.0, 1, 5)[0]["x"], "sr": np.array(16000, np.int64)}
        for theirs, ours in zip(_run_all(_detector(), feed), _run_all(flat, feed)):
            np.testing.assert_array_equal(theirs, ours)
    result = pipeline.run(Case("detector", "int8", "onnxruntime"))
    assert result.status == "passed", result.message
    coverage = result.metrics["recipe"]["coverage"]
    assert (coverage["quantized"], coverage["layers"]) == (4, 4), coverage
    assert coverage["kinds"] == {"MatMul": [2, 2], "DynamicQuantizeLSTM": [2, 2]}, coverage["kinds"]


@pytest.mark.parametrize("take", [True, False])
def test_an_if_on_a_fixed_input_is_flattened_whatever_its_branches_give_back(take):
    """Each output of an ``If`` on a fixed input as the branch taken gives it back: a tensor made in the branch and
    read there again, a constant, one made last; the flattened graph computes what the ``If`` computes, keeps no ``If``,
    and the graph it was made from is left as it was (the branch's constants are renamed in the copy only)."""
    from onnx import TensorProto, helper, numpy_helper

    from quantverdict.export.normalise import normalised

    def branch(name: str, scale: float) -> onnx.GraphProto:
        made = [helper.make_node("Mul", ["x", f"{name}_k"], [f"{name}_y"], name=f"{name}_mul"),
                helper.make_node("Relu", [f"{name}_y"], [f"{name}_r"], name=f"{name}_relu"),
                helper.make_node("Constant", [], [f"{name}_c"], name=f"{name}_constant",
                                 value=numpy_helper.from_array(np.full((2, 3), scale, np.float32)))]
        outputs = [f"{name}_y", f"{name}_c", f"{name}_r"]
        return helper.make_graph(made, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 3])
                                                  for out in outputs],
                                 [numpy_helper.from_array(np.full((), scale, np.float32), f"{name}_k")])

    outputs = ["y", "constant", "r"]
    graph = helper.make_graph(
        [helper.make_node("Equal", ["rate", "k16"], ["is16k"], name="is16k"),
         helper.make_node("If", ["is16k"], outputs, name="by_rate", then_branch=branch("a", 2.0),
                          else_branch=branch("b", -3.0))], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("rate", TensorProto.INT64, [])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 3]) for out in outputs],
        [numpy_helper.from_array(np.array(16000, np.int64), "k16")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    rate = np.array(16000 if take else 8000, np.int64)
    before = model.SerializeToString()
    flat = normalised(model, {"rate": rate})
    assert "If" not in {node.op_type for node in flat.graph.node} and model.SerializeToString() == before
    feed = {"x": np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32), "rate": rate}
    for theirs, ours in zip(_run_all(model, feed), _run_all(flat, feed)):
        np.testing.assert_array_equal(theirs, ours)
