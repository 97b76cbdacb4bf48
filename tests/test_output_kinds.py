"""Each output judged by bounds that fit it: a per-position softmax or a probability map is not held to a logits
bound that one flipped position among thousands fails."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from quantverdict.judge.compare import compare
from quantverdict.judge.output_kinds import output_kinds
from quantverdict.judge.tolerances import ToleranceTable


def _graph(tail: list[onnx.NodeProto], rank: int = 3) -> onnx.ModelProto:
    shape = [None, 4, 6][:rank]
    nodes = [helper.make_node("Identity", ["x"], ["h"]), *tail]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("tail, kind", [
    ([helper.make_node("Softmax", ["h"], ["y"], axis=-1)], "distribution"),
    ([helper.make_node("Softmax", ["h"], ["s"], axis=2), helper.make_node("Identity", ["s"], ["y"])], "distribution"),
    ([helper.make_node("Softmax", ["h"], ["y"], axis=1)], "probabilities"),
    ([helper.make_node("Sigmoid", ["h"], ["y"])], "probabilities"),
    ([helper.make_node("Relu", ["h"], ["y"])], "logits"),
])
def test_an_outputs_kind_is_read_off_the_graph(tail, kind):
    assert output_kinds(_graph(tail)) == {"y": kind}


def test_a_declared_kind_wins_over_the_graph():
    assert output_kinds(_graph([helper.make_node("Relu", ["h"], ["y"])]), {"y": "probabilities"}) == {"y": "probabilities"}


def test_a_distribution_with_one_flipped_position_is_judged_by_positions_not_its_worst_element():
    """A recogniser's softmax over 500 symbols at 8 × 50 positions, INT8-like noise, one position's winner
    flipped outright: max_norm_err is about 1 (the logits bound fails it), 399 of 400 positions agree."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1, (8, 50, 500)) + 12 * np.eye(500)[rng.integers(0, 500, (8, 50))]
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    noisy = probs * (1 + rng.normal(0, 0.01, probs.shape))
    winner = probs[3, 7].argmax()
    noisy[3, 7, winner], noisy[3, 7, (winner + 1) % 500] = 0.0, probs[3, 7, winner]
    table = ToleranceTable.load()
    plain = table.resolve("ocr", "int8", {}, "regression")
    fitting = table.resolve("ocr", "int8", {}, "regression", "distribution")
    as_logits = compare({"y": probs}, {"y": noisy}, plain)
    as_distribution = compare({"y": probs}, {"y": noisy}, plain, per_output={"y": fitting},
                              positionwise=frozenset({"y"}))
    assert not as_logits.passed and as_logits.metrics["y"]["max_norm_err"] > 0.9
    assert as_distribution.passed, as_distribution.explain()
    assert as_distribution.metrics["y"]["top1_agreement"] == pytest.approx(399 / 400)
    assert as_distribution.metrics["y"]["top1_samples"] == 400
