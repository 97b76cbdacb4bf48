"""A case its recipe's placement decides (most weights in float for want of a kernel, layers the recipe does not see)
ends before anything is calibrated or searched, with the reason the graph made and judged would give: a recurrent
network's INT8 and FP8 cases, a network whose weights all live inside an ``If``; ``quantverdict lock`` does not
search for them. Graphs nobody here trained: torch's LSTM export, and an ``If`` written as exporters of scripted
branches do."""
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantverdict.judge.coverage import coverage_verdict
from quantverdict.run.cases import Case
from quantverdict.run.cli import main
from quantverdict.run.pipeline import Pipeline
from quantverdict.tune.decide import decided_before_calibration
from test_exporter_corpus import _Recurrent
from exporters import torch_export

# cache kinds a search or a graph makes
WORK = ("calibration", "recipe-search", "fallback", "semantics", "layer-errors", "precision")


def _manifest(folder: Path, name: str, graph: Path, inputs: str, outputs: list[str]) -> Path:
    """A manifest model with no recipe: a search chooses its INT8 and FP8 recipes (recipe: auto, the default)."""
    (folder / "models.yaml").write_text(textwrap.dedent(f"""\
        models:
          - name: {name}
            onnx: {graph}
            inputs: {inputs}
            outputs: {outputs}
            task: regression
            calibration: synthetic
        """))
    return folder / "models.yaml"


def _made(cache: Path) -> list[str]:
    return sorted(kind for kind in WORK if (cache / kind).exists())


@pytest.fixture
def lstm(tmp_path) -> Path:
    path = tmp_path / "lstm.onnx"
    import torch

    onnx.save(torch_export(_Recurrent.make("LSTM"), (torch.zeros(2, 5, 16),), ["tokens"], ["embedding"],
                           17), str(path))
    return _manifest(tmp_path, "seq", path, "[{name: tokens, shape: [2, 5, 16]}]", ["embedding"])


@pytest.mark.int8
@pytest.mark.fp8
def test_a_recurrent_networks_cases_are_skipped_before_any_calibration_or_search(lstm, tmp_path):
    cache = tmp_path / "cache"
    pipeline = Pipeline(cache, manifest=lstm)
    assert pipeline.recipes.auto("seq", "int8") is not None  # a search would choose its recipe
    for precision in ("int8", "fp8"):
        result = pipeline.run(Case("seq", precision, "onnxruntime"))
        assert result.status == "skipped", result.message
        assert f"runs 1 of 3 weighted layers of 'seq' in {precision.upper()}" in result.message
        assert "2 LSTM in float" in result.message and result.metrics["decided"]
        assert result.metrics["coverage"]["kinds"] == {"LSTM": [0, 2], "Gemm": [1, 1]}
    assert _made(cache) == []  # nothing calibrated, searched, ranked or built


@pytest.mark.int8
def test_the_reason_is_the_one_the_graph_made_and_judged_gives(lstm, tmp_path):
    """Where no fallback is chosen, the coverage of the recipe's placement is the coverage of the graph it makes: the
    same counts, kinds, reasons and verdict."""
    pipeline = Pipeline(tmp_path / "cache", manifest=lstm, recipe_settings={"int8": {"calibration": "max"}})
    decided = decided_before_calibration(pipeline.recipes, "seq", "int8", "emulated")
    recipe = pipeline.recipes.recipe("seq", "int8", "emulated")
    built = {key: value for key, value in pipeline.store.coverage("seq", recipe).items()
             if key not in ("graph", "evaluator")}
    assert decided is not None and decided.coverage == built
    assert (decided.status, decided.message) == coverage_verdict(built, "int8", "seq", "the recipe")


def _branches() -> onnx.ModelProto:
    """A network whose every weight is inside an ``If`` (the sign of its input's sum picks the branch)."""
    rng = np.random.default_rng(5)

    def branch(name: str) -> onnx.GraphProto:
        weight = numpy_helper.from_array(rng.normal(0, 0.3, (8, 8)).astype(np.float32), f"{name}_w")
        return helper.make_graph([helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_y"], name=f"{name}_mm")],
                                 name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [None, 8])],
                                 [weight])

    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["wide"]),
             helper.make_node("If", ["wide"], ["y"], name="by_sign", then_branch=branch("then"),
                              else_branch=branch("other"))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])],
                              [numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_recurrent_layer_inside_a_body_is_kept_for_the_same_reason_as_one_outside():
    """One vocabulary: an LSTM has no INT8 kernel wherever it is, so one inside an ``If`` body is *kept* with that
    reason, as a top-level one is; the MatMul beside it, which a recipe could quantize, is *missed*."""
    from quantverdict.precision import get_recipe
    from quantverdict.precision.coverage import recipe_coverage

    rng = np.random.default_rng(6)
    lstm = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
            for name, shape in (("W", (1, 32, 8)), ("R", (1, 32, 8)))]
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x", "axis0"], ["seq"], name="as_sequence"),
         helper.make_node("LSTM", ["seq", "W", "R"], ["", "h"], name="inner_lstm", hidden_size=8),
         helper.make_node("Squeeze", ["h", "axis0"], ["last"], name="last_state"),
         helper.make_node("MatMul", ["last", "then_w"], ["then_y"], name="then_mm")],
        "then", [], [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, [None, 8])],
        [*lstm, numpy_helper.from_array(rng.normal(0, 0.3, (8, 8)).astype(np.float32), "then_w"),
         numpy_helper.from_array(np.array([0], np.int64), "axis0")])
    model = _branches()
    next(a for a in model.graph.node[2].attribute if a.name == "then_branch").g.CopyFrom(body)
    recipe = get_recipe("int8").configured({})
    coverage = recipe_coverage(model, recipe, model)
    assert coverage["kept"] == {"by_sign/inner_lstm": "no kernel: TensorRT runs LSTM in float (no INT8 recurrent kernel "
                                                      "takes Q/DQ on its weights); ONNX Runtime runs it in INT8 where the "
                                                      "recipe sets recurrent: dynamic (its DynamicQuantizeLSTM)"}
    assert set(coverage["missed"]) == {"by_sign/then_mm", "by_sign/other_mm"}


@pytest.mark.int8
def test_lock_does_not_search_what_coverage_decides(lstm, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["lock", "--manifest", str(lstm), "--precisions", "int8,fp8", "--cache-dir", "cache"]) == 0
    printed = capsys.readouterr().out
    assert "seq int8: not searched: the case is skipped before any calibration: the recipe runs 1 of 3" in printed
    assert "seq fp8: not searched" in printed and not (tmp_path / "quantverdict.lock").exists()
    assert _made(tmp_path / "cache") == []


def _by_rate() -> onnx.ModelProto:
    """A network whose every weight is inside an ``If`` its int64 sample-rate input decides (a voice detector exported
    with both rates is): each branch two MatMuls; the 8 kHz one also reads the rate inside its body."""
    rng = np.random.default_rng(7)

    def branch(name: str, reads_rate: bool) -> onnx.GraphProto:
        weights = [numpy_helper.from_array(rng.normal(0, 0.4, shape).astype(np.float32), f"{name}_w{number}")
                   for number, shape in enumerate([(8, 16), (16, 4)])]
        nodes = [helper.make_node("MatMul", ["x", f"{name}_w0"], [f"{name}_h"], name=f"{name}_mm0"),
                 helper.make_node("Relu", [f"{name}_h"], [f"{name}_r"], name=f"{name}_relu"),
                 helper.make_node("MatMul", [f"{name}_r", f"{name}_w1"], [f"{name}_y"], name=f"{name}_mm1")]
        if reads_rate:
            nodes[-1].output[0] = f"{name}_z"
            nodes += [helper.make_node("Cast", ["sr"], [f"{name}_rate"], to=TensorProto.FLOAT),
                      helper.make_node("Div", [f"{name}_z", f"{name}_rate"], [f"{name}_y"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT,
                                                                                 [None, 4])], weights)

    nodes = [helper.make_node("Equal", ["sr", "rate16k"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], name="by_rate", then_branch=branch("k16", False),
                              else_branch=branch("k8", True))]
    graph = helper.make_graph(nodes, "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8]),
                                             helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
                              [numpy_helper.from_array(np.array(16000, np.int64), "rate16k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.int8
@pytest.mark.parametrize("rate, branch", [(16000, "k16"), (8000, "k8")])
def test_an_if_a_fixed_scalar_input_decides_is_quantized_in_the_branch_that_value_takes(tmp_path, rate, branch):
    """Before: 0 of 4 weighted layers, failed, as for any weights inside a body. With the sample rate fixed in the
    manifest (``value:``), the If is that branch (the rate read inside it too): its 2 layers are quantized and the
    case is judged on them; the FP32 graph computes what the original computes at that rate."""
    import onnxruntime as ort

    path = tmp_path / "vad.onnx"
    onnx.save(_by_rate(), str(path))
    inputs = f"[{{name: x, shape: [4, 8]}}, {{name: sr, shape: [], dtype: int64, value: {rate}}}]"
    pipeline = Pipeline(tmp_path / "cache", manifest=_manifest(tmp_path, "vad", path, inputs, ["y"]))
    result = pipeline.run(Case("vad", "int8", "onnxruntime"))
    assert result.status == "passed", result.message
    coverage = result.metrics["recipe"]["coverage"]
    assert (coverage["quantized"], coverage["layers"]) == (2, 2)
    assert coverage["quantized_layers"] == [f"{branch}_mm0", f"{branch}_mm1"]
    flat = onnx.load(str(pipeline.store.fp32_onnx("vad")))
    assert "If" not in {node.op_type for node in flat.graph.node}
    assert {node.name for node in flat.graph.node if node.op_type == "MatMul"} == {f"{branch}_mm0", f"{branch}_mm1"}
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    feed = {"x": x, "sr": np.array(rate, np.int64)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # each graph as written
    original, flattened = (ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, feed)[0]
                           for model in (str(path), str(pipeline.store.fp32_onnx("vad"))))
    np.testing.assert_array_equal(original, flattened)
