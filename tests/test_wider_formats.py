"""Fallback over several formats (``fallback_format: [fp8, fp16, fp32]``): each layer fallback keeps goes in the
narrowest format in which, alone, it costs the output no more than the most sensitive layer left in INT8 does alone;
the graph, the verdict's reasons, the GPU it needs, a search's choice and the lock all say which. Real graphs of small
networks, one written here with outlier channels as a trained transformer's FFN inputs carry them."""
import textwrap

import onnx
import pytest
import yaml

from quantverdict.capabilities import GPU, Capabilities
from quantverdict.errors import CalibrationError, HarnessError
from quantverdict.tune.auto import AutoSettings, auto_settings
from quantverdict.tune.search import stages
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
