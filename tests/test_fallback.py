"""Accuracy-aware fallback: a recipe's share of its most sensitive layers kept wider, in FP32, FP16 or (out of INT8)
FP8, and over several formats (``fallback_format: [fp8, fp16, fp32]``), each layer in the narrowest format in which,
alone, it costs the output no more than the most sensitive layer left in INT8 does alone; the graph, the verdict's
reasons, the GPU it needs, a search's choice and the lock all say which. Real graphs of small networks, one written
here with outlier channels as a trained transformer's FFN inputs carry them. (How a search ranks fallback's layers
on its folds: test_recipe_search.py.)"""
import textwrap

import numpy as np
import onnx
import pytest
import yaml

from quantverdict.capabilities import GPU, Capabilities
from quantverdict.errors import CalibrationError, HarnessError
from quantverdict.tune.auto import AutoSettings, auto_settings
from quantverdict.tune.stages import stages
from quantverdict.judge.sensitivity import evaluate_recipe, layer_sensitivity
from quantverdict.judge.tolerances import Tolerance
from quantverdict.precision import get_recipe
from quantverdict.precision.wider_layers import precisions_needed
from quantverdict.run.cli import main
from quantverdict.run.pipeline import Case, Pipeline
from quantverdict.tune.lock import RecipeLock
from user_repo import written

OFFERED = ["fp8", "fp16", "fp32"]
NETS = textwrap.dedent('''\
    import torch


    class Outliers(torch.nn.Module):
        """Linear layers each reading two channels 300 times larger than the rest, through weights as much smaller:
        INT8's one scale per tensor rounds the other channels coarsely, E4M3's steps, relative to each value, do not."""

        def __init__(self, gain=300.0):
            super().__init__()
            torch.manual_seed(0)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(4))
            self.register_buffer("gain", torch.ones(32))
            self.gain[:2] = gain
            with torch.no_grad():
                for layer in self.layers:
                    layer.weight[:, :2] /= gain

        def forward(self, x):
            for layer in self.layers:
                x = layer(torch.relu(x) * self.gain)
            return x


    def outliers():
        return Outliers().eval()
    ''')
MANIFEST = textwrap.dedent("""\
    models:
      - name: outliers
        build: widernets:outliers
        inputs: [{name: x, shape: [8, 32], range: [-1, 1]}]
        outputs: [y]
        calibration: synthetic
        build_files: []
        recipe: {int8: {auto: true, max_fallback: 0.5, wider_formats: [fp8, fp16, fp32]}}
    """)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    return written(tmp_path, monkeypatch, {"widernets.py": NETS, "models.yaml": MANIFEST})


def _narrowest(store, model, recipe):
    """Each kept layer's format by the rule, derived here from the layers' SNRs alone on the calibration set."""
    output = store.spec(model).outputs[0]
    base = recipe.with_options(fallback_layers=(), layer_formats=(), fallback=None, fallback_format=("fp32",))
    kept = recipe.options.fallback_layers
    worst_left = min(row.snr_db for row in layer_sensitivity(store, model, base, data="calibration")
                     if row.layer not in kept)
    expected = {}
    for layer in kept:
        expected[layer] = OFFERED[-1]
        for kept_in in OFFERED[:-1]:
            alone = base.with_options(only=(), fallback_layers=(layer,), fallback_format=(kept_in,))
            graph = onnx.load(str(store.precision_onnx(model, alone)))
            if kept_in == "fp8" and not any(n.op_type == "DequantizeLinear" for n in graph.graph.node):
                continue  # no FP8 kernel for it: it would stay FP32
            if evaluate_recipe(store, model, alone, Tolerance(), "calibration").metrics[output]["snr_db"] >= worst_left:
                expected[layer] = kept_in
                break
    return expected


def _check_formats(pipeline, model, formats, manifest=None):
    """The kept layers are FP32 fallback's, each in the format the rule gives, the graph and the verdict agree, and
    FP8's GPU is needed only where a layer is in FP8."""
    store = pipeline.store
    recipe = pipeline.recipes.recipe(model, "int8", "emulated")
    plain = Pipeline(store.cache.root, manifest=manifest, recipe_settings={"int8": {"fallback": 0.5}})
    assert recipe.options.fallback_layers == plain.recipes.recipe(model, "int8", "emulated").options.fallback_layers
    kept = recipe.options.kept()
    assert kept == _narrowest(store, model, recipe) and formats <= set(kept.values())
    graph = onnx.load(str(store.precision_onnx(model, recipe)))
    producer = {out: node for node in graph.graph.node for out in node.output}
    initializers = {init.name for init in graph.graph.initializer}
    for node in (n for n in graph.graph.node if n.name in kept):
        weight = node.input[1]
        made_by = producer.get(weight)
        in_fp8 = made_by is not None and made_by.op_type == "DequantizeLinear" and weight.endswith("_fp8_dequantized")
        assert in_fp8 == (kept[node.name] == "fp8"), node.name
        assert (producer.get(node.input[0]) is not None and producer[node.input[0]].op_type == "Cast") == (
            kept[node.name] == "fp16"), node.name
        assert (weight in initializers and not weight.endswith("fp16_for_" + node.name)) == (kept[node.name] == "fp32")
    reasons = pipeline.run(Case(model, "int8", "onnxruntime")).metrics["coverage"]["kept"]
    assert set(reasons) == set(kept)
    for layer, reason in reasons.items():
        assert reason.startswith(f"fallback: in {kept[layer].upper()}, among the layers"), reason
        assert "; the narrowest of FP8/FP16/FP32 in which, alone, it costs the output no more than" in reason
    needs_fp8 = [needed for needed, _ in precisions_needed("int8", recipe.params()) if needed == "fp8"]
    assert bool(needs_fp8) == ("fp8" in kept.values()) == (recipe.min_opset >= 19)  # float8 Q/DQ: opset 19


def test_outlier_layers_go_to_fp8_where_it_holds_them_as_well_as_int8_holds_the_rest(repo):
    pipeline = Pipeline(repo / "cache", manifest=repo / "models.yaml",
                        recipe_settings={"int8": {"fallback": 0.5, "fallback_format": OFFERED}})
    _check_formats(pipeline, "outliers", {"fp8"}, repo / "models.yaml")


def test_layers_fp8_rounds_worse_than_int8_go_to_fp16_and_to_fp32_where_fp16_costs_more_too(qv_pipeline):
    """A small residual CNN whose INT8 layers alone cost the output little (~68 dB): FP8 holds no kept layer as well,
    FP16 holds one, and the head, whose FP16 rounding alone costs more than the worst INT8 layer left, stays FP32."""
    pipeline = Pipeline(qv_pipeline.store.cache.root, recipe_settings={"int8": {"fallback": 0.5,
                                                                                "fallback_format": OFFERED}})
    _check_formats(pipeline, "resblock", {"fp16", "fp32"})


def test_the_search_offers_the_formats_the_user_allows_and_the_lock_names_each_layers(repo, capsys):
    """``wider_formats`` in ``recipe: auto``: the search's fallback keeps layers in the narrowest of them that holds
    each; the lock writes each float layer with its format, one per line, and a run with the lock builds the same Q/DQ
    graph; a lock that names no format, or one not offered, is one line."""
    assert [option.to_dict() for option in stages(AutoSettings(max_fallback=0.5, wider_formats=("fp8", "fp16", "fp32")),
                                                  layers=4)[2]] == [{"fallback": 0.5, "fallback_format": OFFERED}]
    assert main(["lock", "--manifest", "models.yaml", "--precisions", "int8", "--cache-dir", "cache"]) == 0
    capsys.readouterr()
    path = repo / "quantverdict.lock"
    text = path.read_text()
    entry = yaml.safe_load(text)["recipes"]["outliers"]["int8"]
    assert entry["settings"]["fallback_format"] == OFFERED and entry["settings"]["fallback"] == 0.5
    assert isinstance(entry["float_layers"], dict) and set(entry["float_layers"].values()) <= set(OFFERED)
    assert "      float_layers:\n" + "".join(f"        {layer}: {kept_in}\n" for layer, kept_in in sorted(
        entry["float_layers"].items())) in text
    assert f"fallback_format: [{', '.join(OFFERED)}]" in text  # a candidate's settings stay on one line
    assert RecipeLock.read(path).text() == text
    locked = Pipeline(repo / "fresh-cache", manifest=repo / "models.yaml", lock=path)
    assert locked.recipes.recipe("outliers", "int8", "emulated").options.kept() == entry["float_layers"]
    assert locked.recipes.lock_state("outliers", "int8").same_qdq_graph is True
    ampere = Capabilities(GPU("A100", (8, 0)), {"tensorrt": "10.9.0"})
    reasons = [Pipeline(repo / "cache", manifest=repo / "models.yaml", capabilities=ampere, lock=lock).skip_reason(
        Case("outliers", "int8", "tensorrt")) for lock in (None, path)]
    assert reasons[0] == ("int8 may keep fallback layers in FP8 (wider_formats: fp8/fp16/fp32): fp8 needs compute "
                          "capability ≥ 8.9; this GPU (A100) is 8.0")  # offered, not yet chosen
    assert (reasons[1] == reasons[0]) == ("fp8" in entry["float_layers"].values())  # the lock's formats decide
    assert reasons[1] in (reasons[0], None)
    document = yaml.safe_load(text)
    document["recipes"]["outliers"]["int8"]["float_layers"] = sorted(entry["float_layers"])
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(HarnessError) as caught:
        Pipeline(repo / "cache", manifest=repo / "models.yaml", lock=path)
    assert str(caught.value) == (f"{path}: recipes.outliers.int8.float_layers: fallback_format offers fp8/fp16/fp32, "
                                 "so each layer names its format (layer: format)")
    document["recipes"]["outliers"]["int8"]["float_layers"] = {layer: "fp4" for layer in entry["float_layers"]}
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(HarnessError, match=r"float_layers: \{.*'fp4'.*\} not among the formats fallback_format "
                                           r"offers \(fp8/fp16/fp32\)$"):
        Pipeline(repo / "cache", manifest=repo / "models.yaml", lock=path)


def test_a_check_proposes_the_layers_it_judged_and_ranks_none_again(repo, capsys):
    """A lock whose settings its nearest alternatives beat at the same share of layers kept wider (the lock edited to
    leave out the SmoothQuant its search chose): the check judges them with the lock's layers, and the proposed entry
    names those layers, not a ranking made again on the whole calibration set (none is: no fallback entry is added)."""
    lock = ["lock", "--manifest", "models.yaml", "--precisions", "int8", "--cache-dir", "cache"]
    assert main(lock) == 0
    path = repo / "quantverdict.lock"
    document = yaml.safe_load(path.read_text())
    entry = document["recipes"]["outliers"]["int8"]
    assert entry["settings"].get("smoothquant") and entry["float_layers"]
    worse = {"settings": {key: value for key, value in entry["settings"].items() if key != "smoothquant"}}
    entry["settings"] = worse["settings"]
    path.write_text(yaml.safe_dump(document))
    rankings = sorted((repo / "cache" / "fallback").rglob("*.json"))
    capsys.readouterr()
    assert main([*lock, "--check"]) == 3
    assert "beats the locked" in capsys.readouterr().out
    proposed = yaml.safe_load(path.with_name("quantverdict.lock.proposed").read_text())["recipes"]["outliers"]["int8"]
    assert proposed["settings"] != worse["settings"] and proposed["float_layers"] == entry["float_layers"]
    assert sorted((repo / "cache" / "fallback").rglob("*.json")) == rankings


def test_formats_are_listed_once_narrowest_first_and_fp8_only_out_of_int8():
    assert get_recipe("int8").configured({"fallback_format": ["fp16", "fp32"]}).options.fallback_format == (
        "fp16", "fp32")
    with pytest.raises(CalibrationError, match=r"fallback_format \['fp32', 'fp16'\]: list each format once, "
                                               "narrowest first"):
        get_recipe("int8").configured({"fallback_format": ["fp32", "fp16"]})
    with pytest.raises(CalibrationError, match="fallback_format fp8 in the fp8 recipe: only an INT8 recipe keeps"):
        get_recipe("fp8").configured({"fallback_format": ["fp8", "fp16"]})
    with pytest.raises(CalibrationError, match="recipe auto: wider_formats 'int4': expected one of fp8, fp16, fp32"):
        auto_settings({"auto": True, "wider_formats": "int4"})
    assert auto_settings({"auto": True}).wider_formats == ("fp16", "fp32")
    assert precisions_needed("int8", {"auto": True, "wider_formats": OFFERED})[1] == (
        "fp8", "int8 may keep fallback layers in FP8 (wider_formats: fp8/fp16/fp32): ")  # the formats a search may choose
    assert precisions_needed("int8", {"fallback_format": OFFERED, "layer_formats": {"a": "fp16"}}) == [("int8", "")]


@pytest.mark.int8
def test_recipe_fallback_keeps_its_share_of_layers_most_sensitive_on_calibration_data(qv_pipeline):
    """``fallback: 0.5``: the run's recipe keeps half of the weighted layers (rounded down) in FP32,
    those most sensitive on the calibration set, in that order; it records them, its case's graph has
    exactly those in float, and it is closer to FP32 there than with none kept."""
    store = qv_pipeline.store
    pipeline = Pipeline(store.cache.root, recipe_settings={"int8": {"fallback": 0.5}})
    recipe = pipeline.recipes.recipe("resblock", "int8", "emulated")
    kept = list(recipe.options.fallback_layers)
    base = recipe.with_options(fallback_layers=())
    ranking = [row.layer for row in layer_sensitivity(store, "resblock", base, data="calibration")]
    assert kept and kept == ranking[:len(ranking) // 2]
    snr = [evaluate_recipe(store, "resblock", r, Tolerance(), "calibration").metrics["logits"]["snr_db"]
           for r in (base, recipe)]
    assert snr[1] > snr[0]
    assert recipe.params()["fallback"] == 0.5 and recipe.params()["fallback_layers"] == sorted(kept)
    result = pipeline.run(Case("resblock", "int8", "onnxruntime"))
    assert result.metrics["recipe"]["settings"]["fallback_layers"] == sorted(kept)
    graph = onnx.load(str(pipeline.store.precision_onnx("resblock", recipe)))
    float_weights = {n.name for n in graph.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")
                     and not n.input[1].endswith("_dequantized")}
    assert float_weights == set(kept)


def _weighted(pipeline: Pipeline, model: str) -> set[str]:
    """The layers coverage counts: weighted ones (a product of two activations holds no weights)."""
    from quantverdict.precision.coverage import layers

    return {layer.name for layer in layers(onnx.load(str(pipeline.store.fp32_onnx(model))))}


def test_fallback_in_fp16_rounds_exactly_the_kept_layers_tensors_and_changes_nothing_else(qv_pipeline):
    """``fallback_format: fp16``: the same layers kept as in FP32 (the ranking does not depend on the format), each
    reading its activations and constants rounded to FP16 and its output rounded to FP16 (emulated, for the CPU), or
    computing natively in FP16 between Casts (TensorRT's graph, typed strictly); every quantized layer is as it was,
    and the verdict says which format the kept layers ran in. Attention's activation-by-activation products
    included (a transformer block)."""
    root, model = qv_pipeline.store.cache.root, "transformer-block"
    wider = Pipeline(root, recipe_settings={"int8": {"fallback": 0.5, "fallback_format": "fp16"}})
    recipe = wider.recipes.recipe(model, "int8", "emulated")
    plain = Pipeline(root, recipe_settings={"int8": {"fallback": 0.5}}).recipes.recipe(model, "int8", "emulated")
    kept = recipe.options.fallback_layers
    assert kept and kept == plain.options.fallback_layers
    emulated, fp32_kept = (onnx.load(str(wider.store.precision_onnx(model, r))) for r in (recipe, plain))
    producer = {out: node for node in emulated.graph.node for out in node.output}
    readers = {name: [node for node in emulated.graph.node if name in node.input] for name in producer}
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in emulated.graph.initializer}

    def rounded_in(name):  # made by a Cast to FLOAT of a Cast to FLOAT16
        cast = producer.get(name)
        return (cast is not None and cast.op_type == "Cast" and cast.attribute[0].i == onnx.TensorProto.FLOAT
                and producer[cast.input[0]].op_type == "Cast"
                and producer[cast.input[0]].attribute[0].i == onnx.TensorProto.FLOAT16)

    for node in (n for n in emulated.graph.node if n.name in kept):
        for name in filter(None, node.input):
            assert (np.array_equal(constants[name], constants[name].astype(np.float16).astype(np.float32))
                    if name in constants else rounded_in(name)), (node.name, name)
        (reader,) = readers[node.output[0]]
        assert reader.op_type == "Cast" and reader.attribute[0].i == onnx.TensorProto.FLOAT16
    quantized = [{(n.name, tuple(n.input)) for n in g.graph.node if n.name not in kept} for g in (emulated, fp32_kept)]
    assert quantized[1] <= quantized[0]  # the rest of the graph is the FP32 fallback's, and what is added is Casts
    assert {n.op_type for n in emulated.graph.node if (n.name, tuple(n.input)) in quantized[0] - quantized[1]} == {"Cast"}
    native = onnx.load(str(wider.store.precision_onnx(model, wider.recipes.recipe(model, "int8", "native"))))
    onnx.checker.check_model(native, full_check=True)  # strict types: an FP16 layer reads FP16 only
    inferred = onnx.shape_inference.infer_shapes(native, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    types.update({init.name: init.data_type for init in inferred.graph.initializer})
    for node in (n for n in native.graph.node if n.name in kept):
        assert {types[name] for name in [*filter(None, node.input), *node.output]} == {onnx.TensorProto.FLOAT16}
    result = wider.run(Case(model, "int8", "onnxruntime"))
    reasons = result.metrics["coverage"]["kept"]
    assert set(reasons) == set(kept) & _weighted(wider, model)  # a product of activations is kept, not a layer
    assert reasons and all(r.startswith("fallback: in FP16") for r in reasons.values())
    assert result.metrics["recipe"]["settings"]["fallback_format"] == "fp16"
    assert "fallback_format" not in plain.params()  # FP32 fallback's graphs keep the keys they had


def test_fallback_format_is_fp32_fp16_or_from_int8_fp8():
    with pytest.raises(CalibrationError, match="fallback_format 'fp4': expected one of fp8, fp16, fp32, or several"):
        get_recipe("int8").configured({"fallback_format": "fp4"})
    with pytest.raises(CalibrationError, match="fallback_format fp8 in the fp8 recipe: only an INT8 recipe keeps"):
        get_recipe("fp8").configured({"fallback_format": "fp8"})
    assert get_recipe("int8").configured({"fallback_format": "fp8"}).min_opset == 19  # float8 Q/DQ


def test_fallback_in_fp8_quantizes_exactly_the_kept_layers_in_e4m3_and_changes_nothing_else(qv_pipeline):
    """``fallback_format: fp8`` in an INT8 recipe: the layers FP32 fallback keeps are quantized in E4M3 instead, on the
    recipe's own calibrated ranges (scale amax / 448, where INT8's is amax / 127) and per-channel weight scales; every
    INT8 layer is as it was, the graph is opset 19, and the verdict counts those layers as kept in FP8, not as INT8.
    With GPTQ, the FP8 layers' weights are rounded on E4M3's grid (still stored as E4M3) and the INT8 layers' are the
    FP32 fallback's. Attention's activation-by-activation products included (a transformer block)."""
    from onnx import numpy_helper

    from quantverdict.precision.grids import FP8_E4M3

    root, model = qv_pipeline.store.cache.root, "transformer-block"
    graphs, recipes = {}, {}
    for name, settings in {"fp8": {"fallback_format": "fp8"}, "fp32": {}, "fp8-gptq": {"fallback_format": "fp8",
                           "gptq": True}, "fp32-gptq": {"gptq": True}}.items():
        pipeline = Pipeline(root, recipe_settings={"int8": {"fallback": 0.5, **settings}})
        recipes[name] = pipeline.recipes.recipe(model, "int8", "emulated")
        graphs[name] = onnx.load(str(pipeline.store.precision_onnx(model, recipes[name])))
    kept = recipes["fp8"].options.fallback_layers
    assert kept and kept == recipes["fp32"].options.fallback_layers == recipes["fp8-gptq"].options.fallback_layers
    graph = graphs["fp8"]
    assert next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) >= 19
    onnx.checker.check_model(graph, full_check=True)
    ranges = Pipeline(root, recipe_settings={"int8": {"fallback": 0.5, "fallback_format": "fp8"}}).store.ranges(
        model, recipes["fp8"])
    producer = {out: node for node in graph.graph.node for out in node.output}
    constants = {init.name: init for init in graph.graph.initializer}
    source = {init.name: numpy_helper.to_array(init) for init in onnx.load(str(
        qv_pipeline.store.recipe_source(model, recipes["fp8"]))).graph.initializer}
    for node in (n for n in graph.graph.node if n.name in kept):
        for index in (0, 1):
            dq = producer[node.input[index]]
            assert dq.op_type == "DequantizeLinear"
            scale = numpy_helper.to_array(constants[dq.input[1]])
            if dq.input[0] in constants:  # a weight: per output channel, nearest on E4M3
                stored = constants[dq.input[0]]
                assert stored.data_type == onnx.TensorProto.FLOAT8E4M3FN
                weight = source[producer[node.input[1]].input[0].removesuffix("_fp8_quantized")]
                axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
                shape = [1] * weight.ndim
                shape[axis] = -1
                expected = FP8_E4M3.scale(np.abs(weight).max(axis=tuple(i for i in range(weight.ndim) if i != axis)))
                np.testing.assert_array_equal(scale, expected)
                np.testing.assert_array_equal(numpy_helper.to_array(stored).astype(np.float32),
                                              FP8_E4M3.quantize(weight / expected.reshape(shape)).astype(np.float32))
            else:  # an activation: the recipe's range over E4M3's largest value
                q = producer[dq.input[0]]
                assert constants[q.input[2]].data_type == onnx.TensorProto.FLOAT8E4M3FN
                assert scale == FP8_E4M3.scale(ranges[q.input[0]])
    unchanged = [{(n.name, n.op_type, tuple(n.input)) for n in g.graph.node if n.name not in kept}
                 for g in (graph, graphs["fp32"])]
    assert unchanged[1] <= unchanged[0]  # the INT8 part is FP32 fallback's; what is added is E4M3 Q/DQ
    assert {op for _, op, _ in unchanged[0] - unchanged[1]} == {"QuantizeLinear", "DequantizeLinear"}
    int8 = {i.name: numpy_helper.to_array(i) for i in graphs["fp32-gptq"].graph.initializer if i.data_type == 3}
    with_fp8 = {i.name: i for i in graphs["fp8-gptq"].graph.initializer}
    assert all(np.array_equal(numpy_helper.to_array(with_fp8[name]), value) for name, value in int8.items())
    rounded = [i for i in graphs["fp8-gptq"].graph.initializer if i.data_type == onnx.TensorProto.FLOAT8E4M3FN
               and i.dims]
    nearest = {i.name: numpy_helper.to_array(i).astype(np.float32) for i in graph.graph.initializer}
    assert rounded and any(not np.array_equal(numpy_helper.to_array(i).astype(np.float32), nearest[i.name])
                           for i in rounded)  # GPTQ moved some of them, on E4M3's grid
    result = Pipeline(root, recipe_settings={"int8": {"fallback": 0.5, "fallback_format": "fp8"}}).run(
        Case(model, "int8", "onnxruntime"))
    coverage = result.metrics["coverage"]
    assert set(coverage["kept"]) == set(kept) & _weighted(qv_pipeline, model)
    assert coverage["kept"] and all(reason.startswith("fallback: in FP8") for reason in coverage["kept"].values())
    assert not set(kept) & set(coverage["quantized_layers"]) and not coverage["missed"]
    assert result.metrics["recipe"]["settings"]["fallback_format"] == "fp8"


def test_fallback_in_fp8_keeps_in_fp32_the_layers_tensorrt_has_no_fp8_kernel_for_and_says_so(qv_pipeline):
    """FP8 has no TensorRT kernel for a depthwise convolution (Model Optimizer's rules): a kept depthwise layer stays
    FP32 in the graph, and its reason says FP32 and why, not FP8; the verdict's reasons agree with the graph."""
    pipeline = Pipeline(qv_pipeline.store.cache.root, recipe_settings={"int8": {"fallback": 0.99,
                                                                                "fallback_format": "fp8"}})
    recipe = pipeline.recipes.recipe("dwblock", "int8", "emulated")
    graph = onnx.load(str(pipeline.store.precision_onnx("dwblock", recipe)))
    kept = pipeline.run(Case("dwblock", "int8", "onnxruntime")).metrics["coverage"]["kept"]
    assert set(kept) == set(recipe.options.fallback_layers)
    in_fp8 = {n.name for n in graph.graph.node if n.name in kept and n.input[1].endswith("_fp8_dequantized")}
    assert in_fp8 and in_fp8 != set(kept)
    no_kernel = "fallback: in FP32, as TensorRT has no FP8 kernel for a convolution of"
    for layer, reason in kept.items():
        assert reason.startswith("fallback: in FP8" if layer in in_fp8 else no_kernel), (layer, reason)


def test_fallback_share_must_be_a_fraction():
    with pytest.raises(CalibrationError, match="fallback 10: expected a share of the layers between 0 and 1"):
        get_recipe("int8").configured({"fallback": 10})
