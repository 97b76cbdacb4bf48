"""Each output judged by bounds that fit it: a per-position softmax or a probability map is not held to a logits
bound that one flipped position among thousands fails."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from quantverdict.judge.compare import compare
from quantverdict.judge.output_kinds import measured, output_kinds
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


def _ids(dtype: int, tail: list[onnx.NodeProto]) -> onnx.ModelProto:
    """Scores [batch, positions, 15] and, first among the outputs, what ``tail`` makes of them (named ``ids``)."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [8, 15], np.random.default_rng(3).normal(0, 1, 120).tolist())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["scores"], name="mm"), *tail]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6, 8])],
                              [helper.make_tensor_value_info("ids", dtype, [4, 6] if tail[-1].op_type != "Greater"
                                                             else [4, 6, 15]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [4, 6, 15])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


ARGMAX = helper.make_node("ArgMax", ["scores"], ["ids"], axis=-1, keepdims=0)


@pytest.mark.parametrize("dtype, tail", [
    (TensorProto.INT64, [ARGMAX]),
    (TensorProto.UINT8, [helper.make_node("ArgMax", ["scores"], ["i"], axis=-1, keepdims=0),
                         helper.make_node("Cast", ["i"], ["ids"], to=TensorProto.UINT8)]),
    (TensorProto.BOOL, [helper.make_node("Greater", ["scores", "scores"], ["ids"])]),
])
def test_an_output_of_integers_or_booleans_is_labels(dtype, tail):
    assert output_kinds(_ids(dtype, tail)) == {"ids": "labels", "scores": "logits"}


def test_labels_are_judged_by_the_share_that_agree_not_by_the_distance_between_ids():
    """Diacritic ids at 128 × 64 positions: 6 changed (from 1 to 14 and so on, as FP16 changed piper's diacritizer's)
    keep FP16's agreement bound, though the worst element's error is nearly the largest id; a fifth changed fails
    INT8's, and says so as an agreement."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 15, (128, 64)).astype(np.uint8)
    table = ToleranceTable.load()
    for precision, changed, passes in (("fp16", 6, True), ("int8", ids.size // 5, False)):
        moved = ids.copy()
        where = rng.choice(ids.size, changed, replace=False)
        moved.flat[where] = (moved.flat[where] + rng.integers(1, 15, changed)) % 15
        plain = table.resolve("tashkeel", precision, {}, "regression")
        as_labels = compare({"ids": ids}, {"ids": moved}, plain, per_output={
            "ids": table.resolve("tashkeel", precision, {}, "regression", "labels")}, labels=frozenset({"ids"}))
        assert as_labels.metrics["ids"]["label_agreement"] == pytest.approx(1 - changed / ids.size)
        assert as_labels.metrics["ids"]["label_samples"] == ids.size
        assert as_labels.passed == passes, as_labels.explain()
        assert [check.metric for check in as_labels.failures()] == ([] if passes else ["label_agreement"])
    assert not compare({"ids": ids}, {"ids": moved}, table.resolve("tashkeel", "fp16", {}, "regression")).passed


def test_a_search_scores_the_first_output_holding_no_decisions():
    assert measured(["ids", "scores"], {"ids": "labels", "scores": "logits"}) == "scores"
    assert measured(["ids", "mask"], {"ids": "labels", "mask": "labels"}) == "ids"


def test_a_models_argmax_output_passes_fp16_by_its_agreement_in_a_run(tmp_path):
    """Before: the ids (declared first, as piper's diacritizer declares them) failed FP16 on ``max_norm_err``."""
    from quantverdict.run.cases import Case
    from quantverdict.run.pipeline import Pipeline

    onnx.save(_ids(TensorProto.INT64, [ARGMAX]), str(tmp_path / "ids.onnx"))
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: ids\n    onnx: ids.onnx\n    inputs: [{name: x, shape: [4, 6, 8]}]\n"
        "    outputs: [ids, scores]\n    calibration: synthetic\n")
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    result = pipeline.run(Case("ids", "fp16", "onnxruntime"))
    assert result.status == "passed", result.message
    checks = {(check["output"], check["metric"]) for check in result.metrics["checks"]}
    assert ("ids", "label_agreement") in checks and ("ids", "max_norm_err") not in checks


def test_a_runtime_is_held_to_the_recipes_semantics_on_its_float_outputs_not_on_labels():
    """INT8's semantics kept every id FP32 gives (its rounding noise on the scores only); a runtime whose scores
    deviate by a tenth of that noise flips one id of 1024 near a tie. Judged on the ids, that is an infinite flip
    fraction; on the scores, a faithful runtime. The ids keep their own bound: agreement with FP32's."""
    from quantverdict.judge.fidelity import judge_fidelity

    rng = np.random.default_rng(2)
    scores = rng.normal(0, 1, (64, 16, 15))
    semantics_scores = scores + rng.normal(0, 0.05, scores.shape)
    runtime_scores = semantics_scores + rng.normal(0, 0.005, scores.shape)
    ids = scores.argmax(-1)
    flipped = ids.copy()
    flipped[5, 3] = (flipped[5, 3] + 1) % 15
    reference, semantics = {"ids": ids, "scores": scores}, {"ids": ids, "scores": semantics_scores}
    runtime = {"ids": flipped, "scores": runtime_scores}
    both = judge_fidelity(reference, semantics, runtime, "onnxruntime", "cpu")
    assert not both.passed and both.outputs[0].flip_fraction == float("inf")
    floats = judge_fidelity(reference, semantics, runtime, "onnxruntime", "cpu", labels=frozenset({"ids"}))
    assert floats.passed and [output.output for output in floats.outputs] == ["scores"]
    alone = judge_fidelity({"ids": ids}, {"ids": ids}, {"ids": flipped}, "onnxruntime", "cpu",
                           labels=frozenset({"ids"}))
    assert [output.output for output in alone.outputs] == ["ids"]


def test_a_cases_headline_is_its_measured_output_not_its_labels():
    """The table's, page's, history's and gate's cosine and SNR are those of the output a search scores: piper's
    diacritizer's headline read the cosine of its ids (0.99960) beside its logits' top-1."""
    from quantverdict.report.schema import ViewRecord

    view = ViewRecord.model_validate({"metrics": {"ids": {"cosine": 0.9996, "label_agreement": 0.9993},
                                                  "scores": {"cosine": 0.99999, "top1_agreement": 0.9993}}})
    assert view.measured().cosine == 0.99999
    only_labels = ViewRecord.model_validate({"metrics": {"ids": {"cosine": 0.5, "label_agreement": 0.9}}})
    assert only_labels.measured().cosine == 0.5
    assert ViewRecord().measured().cosine is None
