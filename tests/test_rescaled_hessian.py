"""GPTQ's H of a prepared graph (equalization, SmoothQuant) derived from the graph before preparation: the same H as
measured on the prepared graph, to the prepared graph's own float32 rounding, from one measurement for every
preparation (a search prepares once per fold, from that fold's ranges)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantverdict.cache import Cache
from quantverdict.precision import hessian
from quantverdict.precision.calibrate import FORWARD_PASSES, channel_ranges
from quantverdict.precision.gptq import roundable
from quantverdict.precision.hessian import derived, measured
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.grids import INT8

# The prepared graph's activations are float32 products of rescaled weights: each element within a few float32 ulps of
# the exact rescaling (2^-23 relative each, a dot product of up to 27 terms), so H, a sum of their products, is too.
RELATIVE = 64 * 2.0 ** -23


def _depthwise_net() -> onnx.ModelProto:
    """x [n, 3, 12, 12] → Conv 3→8 → ReLU6 → depthwise Conv 3×3 → Conv 8→4 (the pair equalization balances),
    seeded, channel scales far apart."""
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((8, 3, 3, 3)) * np.geomspace(0.01, 10, 8)[:, None, None, None],
               rng.standard_normal(8), rng.standard_normal((8, 1, 3, 3)), rng.standard_normal((4, 8, 1, 1))]
    inits = [numpy_helper.from_array(np.asarray(w, np.float32), name) for w, name in zip(weights, ["w0", "b0", "w1",
                                                                                                     "w2"])]
    inits += [numpy_helper.from_array(np.float32(0), "low"), numpy_helper.from_array(np.float32(6), "high")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"], name="first", pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["a", "low", "high"], ["r"], name="relu6"),
             helper.make_node("Conv", ["r", "w1"], ["d"], name="depthwise", group=8, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "w2"], ["y"], name="pointwise")]
    graph = helper.make_graph(nodes, "dw-rescaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   ["n", 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _linear_net() -> onnx.ModelProto:
    """x [n, 16] with outlier channels → MatMul → Relu → MatMul (what SmoothQuant rescales), seeded."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), f"w{index}")
             for index, shape in enumerate([(16, 8), (8, 4)])]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="first"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w1"], ["y"], name="second")]
    graph = helper.make_graph(nodes, "mm-rescaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _batches(model: onnx.ModelProto, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shape = [8, 3, 12, 12] if model.graph.name == "dw-rescaled" else [8, 16]
    gains = np.geomspace(0.1, 30, shape[1]).reshape(1, -1, *[1] * (len(shape) - 2))
    return [{"x": (rng.standard_normal(shape) * gains).astype(np.float32)} for _ in range(count)]


def _channel_ranges(cache: Cache, batches):
    """Per-channel ranges as a recipe's preparation asks for them (the graph's tensors over ``batches``)."""
    return lambda graph, tensors, axis: channel_ranges(cache, graph, tensors, axis, batches)


@pytest.mark.parametrize("net,settings", [(_depthwise_net, {"equalize": True}), (_linear_net, {"smoothquant": 0.5})])
def test_derived_second_moments_are_those_measured_on_the_prepared_graph(net, settings, monkeypatch, tmp_path):
    model, recipe = net(), QDQ(INT8).configured(settings)
    batches = _batches(model, 3, 1)
    prepared = recipe.prepare(model, _channel_ranges(Cache(tmp_path), batches))
    assert prepared.rescaling is not None and prepared.rescaling.tensors  # something was rescaled
    assert all(np.ptp(rescale.factor) > 0 for rescale in prepared.rescaling.tensors.values())
    layers = roundable(prepared.graph)
    monkeypatch.setattr(hessian, "_MEASURED", type(hessian._MEASURED)(1 << 30, hessian._MEASURED.size))
    _, sums = measured(prepared.graph, layers, batches, lambda: layers)
    found = derived(prepared.rescaling, layers, batches, roundable)
    assert found is not None
    rescaled = {prepared.rescaling.tensors.get(layer.node.input[0]) is not None for layer in layers}
    assert rescaled == ({True, False} if settings.get("equalize") else {True})  # the inputs' kinds, each checked
    for layer, (product, vectors) in zip(layers, found[1]):
        mine, theirs = sums[layer.key]
        assert vectors == theirs
        scale = np.abs(mine).max()
        assert np.abs(product - mine).max() <= RELATIVE * scale, layer.node.name


def test_one_measurement_serves_every_preparation(monkeypatch, tmp_path):
    """Two folds' preparations (equalized from different ranges): the graph before them is measured once per batch
    set, and each fold's H differs as its rescaling does."""
    model = _depthwise_net()
    recipe = QDQ(INT8).configured({"equalize": True})
    batches = _batches(model, 3, 1)
    monkeypatch.setattr(hessian, "_MEASURED", type(hessian._MEASURED)(1 << 30, hessian._MEASURED.size))
    preparations = []
    for seed in (3, 4):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        preparations.append(recipe.prepare(copy, _channel_ranges(Cache(tmp_path), _batches(model, 2, seed))))
    passes = FORWARD_PASSES[model.graph.name]
    found = [derived(p.rescaling, roundable(p.graph), batches, roundable) for p in preparations]
    assert FORWARD_PASSES[model.graph.name] - passes == len(batches)  # one pass, not one per preparation
    assert found[0][0] != found[1][0]  # kept apart: their rounding is not shared
    depthwise = [index for index, layer in enumerate(roundable(preparations[0].graph))
                 if layer.node.name == "depthwise"][0]
    assert not np.allclose(found[0][1][depthwise][0], found[1][1][depthwise][0])


def test_a_search_measures_the_graph_before_preparation_for_every_set_in_one_pass(monkeypatch, tmp_path):
    """Within a search (its sets :func:`planned`), the first fold's H of the unprepared graph is measured with every
    other set's in the same pass: each fold's preparation then finds its own kept."""
    from quantverdict.precision.batch_sets import planned
    from quantverdict.tune.folds import folds, split

    model = _depthwise_net()
    batches = _batches(model, 4, 1)
    sets = [batches, *(split(batches, "m", fold)[0] for fold in range(folds(batches)))]
    recipe = QDQ(INT8).configured({"equalize": True})
    monkeypatch.setattr(hessian, "_MEASURED", type(hessian._MEASURED)(1 << 30, hessian._MEASURED.size))
    preparations = []
    for found in sets[1:]:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        preparations.append((recipe.prepare(copy, _channel_ranges(Cache(tmp_path), found)), found))
    passes = FORWARD_PASSES[model.graph.name]
    with planned(sets):
        for prepared, found in preparations:
            assert derived(prepared.rescaling, roundable(prepared.graph), found, roundable) is not None
    assert FORWARD_PASSES[model.graph.name] - passes == len(batches)  # each batch once, for the four folds


@pytest.mark.parametrize("net,settings", [(_depthwise_net, {"equalize": True, "gptq": True}),
                                          (_linear_net, {"smoothquant": 0.5, "gptq": True})])
def test_a_searchs_first_calibration_pass_measures_what_its_candidates_ask_of_the_graph(net, settings, monkeypatch,
                                                                                         tmp_path):
    """Within a search, the pass that calibrates the unprepared graph for every set also measures, for every set, the
    channel ranges its preparation asks for (equalization's, SmoothQuant's) and GPTQ's H: asked afterwards for each
    set, they cost no pass, and they are what a pass of their own measures outside any search, bit for bit (the same
    prepared graph, the same H)."""
    from quantverdict.precision import calibrate as calibration
    from quantverdict.precision import first_pass
    from quantverdict.precision.batch_sets import planned
    from quantverdict.precision.riders import riding
    from quantverdict.precision.settings import RecipeSettings
    from quantverdict.tune.folds import folds, split

    model = net()
    batches = _batches(model, 4, 1)
    sets = [batches, *(split(batches, "m", fold)[0] for fold in range(folds(batches)))]
    recipe = QDQ(INT8).configured(settings)

    def fresh_tables() -> None:
        monkeypatch.setattr(hessian, "_MEASURED", type(hessian._MEASURED)(1 << 30, hessian._MEASURED.size))
        monkeypatch.setattr(calibration, "_CHANNEL_RANGES", {})
        monkeypatch.setattr(calibration, "_HISTOGRAMS", {})

    def asked(cache: Cache) -> list[tuple[bytes, list[np.ndarray]]]:
        """Each set's prepared graph and its layers' H derived from the unprepared graph's, as a candidate asks."""
        found = []
        for each in sets:
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            prepared = recipe.prepare(copy, _channel_ranges(cache, each))
            _, moments = derived(prepared.rescaling, roundable(prepared.graph), each, roundable)
            found.append((prepared.graph.SerializeToString(), [product for product, _ in moments]))
        return found

    fresh_tables()
    passes = FORWARD_PASSES[model.graph.name]
    with planned(sets), riding(first_pass.planned([RecipeSettings(**settings)])):
        calibration.calibrate(Cache(tmp_path / "search"), model.SerializeToString(),
                              recipe.calibration_recipe().tensors_to_calibrate(model), sets[1], shared=True)
        assert FORWARD_PASSES[model.graph.name] - passes == len(batches)  # every set's histograms, each batch once
        ridden = asked(Cache(tmp_path / "search"))
    assert FORWARD_PASSES[model.graph.name] - passes == len(batches)  # and nothing more for the candidates
    fresh_tables()
    alone = asked(Cache(tmp_path / "alone"))
    assert FORWARD_PASSES[model.graph.name] - passes > len(batches)  # measured alone: passes of their own
    for (graph, moments), (theirs, their_moments) in zip(ridden, alone):
        assert graph == theirs and all(np.array_equal(mine, other) for mine, other in zip(moments, their_moments))
