"""A search's overlapping sets of calibration batches measured in one pass: each set's statistics (ranges, channel
ranges, GPTQ's H) are bit for bit those it has measured alone, for fewer forward passes."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantverdict.cache import Cache
from quantverdict.precision import calibrate as calibration, hessian
from quantverdict.precision.batch_sets import planned, union
from quantverdict.precision.calibrate import FORWARD_PASSES, calibrate, channel_ranges
from quantverdict.precision.calibrators import Calibrator
from quantverdict.precision.hessian import LayerInputs, measured, second_moments
from quantverdict.tune.folds import folds, split


def _graph(name: str) -> onnx.ModelProto:
    """x [n, 16] → MatMul → Relu → MatMul → y [n, 4], seeded."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), f"w{index}")
               for index, shape in enumerate([(16, 8), (8, 4)])]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="first"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w1"], ["y"], name="second")]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": (rng.standard_normal((8, 16)) * (1 + index)).astype(np.float32)} for index in range(count)]


def _sets(batches: list) -> list[list]:
    """What a search calibrates on: the whole set and each fold's calibration part."""
    return [batches, *(split(batches, "m", fold)[0] for fold in range(folds(batches)))]


def test_the_union_meets_each_sets_batches_in_its_order_each_batch_once_where_orders_agree():
    a, b, c, d = ({"x": np.full(1, value, np.float32)} for value in range(4))
    order, holders = union([[a, b, c, d], [a, b, c], [b, c, d], [a, d]])
    assert [batch["x"][0] for batch in order] == [0, 1, 2, 3]
    assert holders == [[0, 1, 3], [0, 1, 2], [0, 1, 2], [0, 2, 3]]
    order, holders = union([[a, b], [b, a]])  # orders disagree: ``a`` is met again after ``b``
    assert [batch["x"][0] for batch in order] == [0, 1, 0] and holders == [[0], [0, 1], [1]]


@pytest.mark.parametrize("method", ["max", "percentile", "mse"])
def test_planned_sets_calibrate_as_each_alone_in_fewer_passes(tmp_path, monkeypatch, method):
    model, batches = _graph(f"sets-{method}"), _batches(5)
    tensors, sets = ["h", "r", "y"], _sets(batches)
    alone = [calibrate(Cache(tmp_path / "alone"), model.SerializeToString(), tensors, found, Calibrator(method))
             for found in sets]
    monkeypatch.setattr(calibration, "_HISTOGRAMS", {})
    before = FORWARD_PASSES[model.graph.name]
    with planned(sets):
        together = [calibrate(Cache(tmp_path / "together"), model.SerializeToString(), tensors, found,
                              Calibrator(method)) for found in sets]
    assert together == alone
    # the first set alone (5 batches), then the four others in one pass over the 5 batches they hold
    assert FORWARD_PASSES[model.graph.name] - before == 2 * len(batches)
    monkeypatch.setattr(calibration, "_HISTOGRAMS", {})
    before = FORWARD_PASSES[model.graph.name]
    with planned(sets):  # a graph every set is calibrated on (the unprepared graph): all of them in its first pass
        shared = [calibrate(Cache(tmp_path / "shared"), model.SerializeToString(), tensors, found, Calibrator(method),
                            shared=True) for found in sets]
    assert shared == alone and FORWARD_PASSES[model.graph.name] - before == len(batches)


def test_planned_sets_have_the_channel_ranges_each_has_alone(tmp_path):
    model, batches = _graph("sets-channels"), _batches(4)
    sets = _sets(batches)
    alone = [channel_ranges(Cache(tmp_path / "alone"), model.SerializeToString(), ["h"], -1, found) for found in sets]
    with planned(sets):
        together = [channel_ranges(Cache(tmp_path / "together"), model.SerializeToString(), ["h"], -1, found)
                    for found in sets]
    for mine, theirs in zip(together, alone):
        assert np.array_equal(mine["h"], theirs["h"])


def test_planned_sets_have_the_second_moments_each_has_alone(monkeypatch):
    model, batches = _graph("sets-hessian"), _batches(4)
    sets = _sets(batches)
    layers = [LayerInputs(node, (16, 8) if node.name == "first" else (8, 4), 1, 16 if node.name == "first" else 8)
              for node in model.graph.node if node.op_type == "MatMul"]
    monkeypatch.setattr(hessian, "_MEASURED", type(hessian._MEASURED)(1 << 30, hessian._MEASURED.size))
    alone = [measured(model, layers, found, lambda: layers)[1] for found in sets]
    monkeypatch.setattr(hessian, "_MEASURED", type(hessian._MEASURED)(1 << 30, hessian._MEASURED.size))
    before = FORWARD_PASSES[model.graph.name]
    with planned(sets):
        together = [measured(model, layers, found, lambda: layers)[1] for found in sets]
    assert FORWARD_PASSES[model.graph.name] - before == 2 * len(batches)
    monkeypatch.setattr(hessian, "_MEASURED", type(hessian._MEASURED)(1 << 30, hessian._MEASURED.size))
    before = FORWARD_PASSES[model.graph.name]
    with planned(sets):  # a graph no preparation rescaled (every set's H is asked of it): all sets in its first pass
        unprepared = [dict(zip((layer.key for layer in layers), second_moments(model, layers, found, lambda _: layers)[1]))
                      for found in sets]
    assert FORWARD_PASSES[model.graph.name] - before == len(batches)
    for measured_sets in (together, unprepared):
        for mine, theirs in zip(measured_sets, alone):
            for key, (product, vectors) in theirs.items():
                assert np.array_equal(mine[key][0], product) and mine[key][1] == vectors


@pytest.mark.parametrize("method", ["max", "percentile"])
def test_a_graph_rewritten_at_its_last_layer_measures_only_the_tensors_it_changed(tmp_path, monkeypatch, method):
    """As SmoothQuant rewrites a CNN's classifier alone: the tensors computed as in a graph calibrated before (the same
    nodes, weights and inputs, whatever the graph's name) are not measured again, and every range is the one the
    rewritten graph gives measured alone."""
    model, batches = _graph(f"rewritten-{method}"), _batches(3)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    rewritten.graph.name = "another-name"
    last = rewritten.graph.initializer[1]
    last.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(last) * 2, last.name))
    tensors = ["x", "h", "r", "y"]
    alone = calibrate(Cache(tmp_path / "alone"), rewritten.SerializeToString(), tensors, batches, Calibrator(method))
    monkeypatch.setattr(calibration, "_HISTOGRAMS", {})
    asked: list[list[str]] = []
    collect = calibration.collect_histograms
    monkeypatch.setattr(calibration, "collect_histograms",
                        lambda model_bytes, names, sets, **more: asked.append(list(names))
                        or collect(model_bytes, names, sets, **more))
    calibrate(Cache(tmp_path / "first"), model.SerializeToString(), tensors, batches, Calibrator(method))
    shared = calibrate(Cache(tmp_path / "second"), rewritten.SerializeToString(), tensors, batches, Calibrator(method))
    assert asked == [tensors, ["y"]] and shared == alone


@pytest.mark.parametrize("first", ["whole", "fold"])
def test_gptq_rounds_a_searchs_other_sets_in_the_pass_that_rounds_the_first_as_each_alone(monkeypatch, first):
    """Within a search, GPTQ asked to round an unprepared graph for one set rounds the same layers for the search's
    other sets too, their H kept by the first pass, in the same pass over the columns: asked afterwards, those round
    nothing, and every set's weights are the bytes that rounding it alone writes. Asked of a fold first (a candidate's
    first fold), the whole set is not among them: it is rounded in its own turn (only a chosen recipe is made of it)."""
    from quantverdict.precision import gptq
    from quantverdict.precision.grids import INT8
    from quantverdict.precision.qdq import QDQ

    model, batches = _graph("sets-gptq"), _batches(4)
    sets, recipe = _sets(batches), QDQ(INT8)
    ranges = {name: 8.0 for name in recipe.tensors_to_calibrate(model)}

    def rounded(found: list) -> dict[str, np.ndarray]:
        quantized = gptq.round_weights(recipe.apply(model, ranges), model, found)  # apply writes a copy
        return {init.name: numpy_helper.to_array(init) for init in quantized.graph.initializer}

    def fresh_tables() -> None:
        monkeypatch.setattr(hessian, "_MEASURED", type(hessian._MEASURED)(1 << 30, hessian._MEASURED.size))
        monkeypatch.setattr(gptq, "_ROUNDED", type(gptq._ROUNDED)(1 << 30, gptq._ROUNDED.size))

    fresh_tables()
    alone = [rounded(found) for found in sets]
    fresh_tables()
    calls, rounding = [], gptq.rounded_columns
    monkeypatch.setattr(gptq, "rounded_columns", lambda *args: calls.append(len(args[0])) or rounding(*args))
    order = list(range(len(sets))) if first == "whole" else [*range(1, len(sets)), 0]
    with planned(sets):
        together = [rounded(sets[index]) for index in order]
    together = [together[order.index(index)] for index in range(len(sets))]
    # the first set's two layers (two shapes), each with every set's (but the whole, asked of a fold; then it alone)
    assert calls == ([len(sets)] * 2 if first == "whole" else [len(sets) - 1] * 2 + [1] * 2), calls
    for mine, theirs in zip(together, alone):
        assert mine.keys() == theirs.keys() and all(np.array_equal(mine[name], theirs[name]) for name in mine)
    assert any(not np.array_equal(alone[0][name], alone[1][name]) for name in alone[0])  # the sets' H differ
