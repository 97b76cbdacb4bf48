"""Recipe techniques (Q/DQ placement as Model Optimizer places it, SmoothQuant, activation
equalization, low-float saturation) and task metrics: each keeps what it must keep (the FP32
function) and changes what it claims to, on real ONNX Runtime evaluations."""
import functools
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantverdict.cache import Cache
from quantverdict.errors import HarnessError
from quantverdict.export.compat import make_model
from quantverdict.judge.task_metrics import embedding_agreement
from quantverdict.precision import get_recipe
from quantverdict.precision.calibrate import calibrate, channel_ranges
from quantverdict.precision.grids import INT8
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.settings import RecipeSettings
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline

TINY_BERT = """import torch
from quantverdict.models.nets import BertEncoder


def build():
    torch.manual_seed(3)
    return BertEncoder(vocab=64, dim=32, layers=2, heads=4, hidden=64).eval()


def batches(seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(4):
        ids = rng.integers(1, 64, (8, 12))
        mask = (np.arange(12)[None] < rng.integers(3, 13, (8, 1))).astype(np.int64)
        out.append({"input_ids": ids * mask, "attention_mask": mask})
    return out


def calibration():
    return batches(1)


def evaluation():
    return batches(2)
"""


@pytest.fixture
def token_model(tmp_path) -> Pipeline:
    """A small random-weight BERT with token inputs and padded attention masks, declared in a manifest."""
    (tmp_path / "tiny_bert.py").write_text(TINY_BERT)
    (tmp_path / "models.yaml").write_text("""models:
  - name: tiny-bert
    build: tiny_bert:build
    build_files: []
    inputs:
      - {name: input_ids, shape: [8, 12], dtype: int64, range: [1, 64], dynamic_axes: {0: batch, 1: tokens}}
      - {name: attention_mask, shape: [8, 12], dtype: int64, range: [1, 2], dynamic_axes: {0: batch, 1: tokens}}
    outputs: [embedding]
    task: embedding
    calibration: tiny_bert:calibration
    eval: tiny_bert:evaluation
""")
    return Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output}


@pytest.mark.int8
def test_an_attention_mask_and_a_transformers_residual_adds_stay_in_float(token_model):
    """No Add of the encoder gets a Q/DQ pair (no convolution to fuse into: Model Optimizer's rule),
    so the mask's large negative bias never sets a scale; every MatMul input is quantized (the default
    recipe: the model's own, ``recipe: auto``, may keep a few layers in FP32)."""
    recipe = get_recipe("int8").for_target("emulated")
    graph = onnx.load(str(token_model.store.precision_onnx("tiny-bert", recipe))).graph
    producers = _producers(graph)
    adds = [n for n in graph.node if n.op_type == "Add"]
    assert adds and not any(producers.get(i) is not None and producers[i].op_type == "DequantizeLinear"
                            for n in adds for i in n.input)
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    assert all(producers[i].op_type == "DequantizeLinear" for n in matmuls for i in n.input)
    result = token_model.run(Case("tiny-bert", "int8", "onnxruntime"))
    assert result.status == "passed", result.message


@pytest.mark.int8
def test_a_residual_add_after_a_convolution_is_quantized_on_its_residual_input_only(qv_pipeline):
    recipe = qv_pipeline.recipes.recipe("resblock", "int8", "emulated")
    graph = onnx.load(str(qv_pipeline.store.precision_onnx("resblock", recipe))).graph
    producers = _producers(graph)
    (add,) = [n for n in graph.node if n.op_type == "Add"]
    kinds = [producers[i].op_type for i in add.input]
    assert sorted(kinds) == ["Conv", "DequantizeLinear"]  # the branch is fused into its convolution


@pytest.mark.fp16
@pytest.mark.bf16
def test_low_float_graphs_keep_a_masks_large_negative_number_finite(token_model):
    """finfo(float32).min rounds to −inf in FP16 and BF16, and 0 × −inf is NaN: constants saturate
    to the type's largest finite value, as TensorRT and ONNX's float16 converters store them."""
    for precision in ("fp16", "bf16"):
        result = token_model.run(Case("tiny-bert", precision, "onnxruntime"))
        assert result.status == "passed", result.message
        assert result.metrics["metrics"]["embedding"]["nonfinite"] == 0


def _linear_with_outliers(tmp_path: Path) -> tuple[onnx.ModelProto, list[dict], list[dict]]:
    """y = x W over 64 input channels, 4 of which carry values 100× the rest (a LayerNorm output's
    outlier channels)."""
    rng = np.random.default_rng(0)
    weight = rng.normal(0, 0.1, (64, 32)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="linear")], "outliers",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # older runtimes read it
    gain = np.ones(64, np.float32)
    gain[[3, 17, 40, 61]] = 100.0

    def draw(seed: int) -> list[dict]:
        data = np.random.default_rng(seed)
        return [{"x": (data.normal(0, 1, (32, 64)) * gain).astype(np.float32)} for _ in range(4)]

    return model, draw(1), draw(2)


def _run(model: onnx.ModelProto, batches: list[dict]) -> np.ndarray:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, b)[0] for b in batches])


def _snr(reference: np.ndarray, candidate: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / np.sum((candidate - reference) ** 2.0)))


def _quantized(model: onnx.ModelProto, calibration: list[dict], cache: Cache, fmt=INT8,
               **settings) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The prepared FP32 graph and the recipe's graph, made as the artifact store makes them: prepare,
    calibrate, apply, correct."""
    recipe = QDQ(fmt).configured(settings)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    prepared = recipe.prepare(copy, lambda graph, tensors, axis: channel_ranges(cache, graph, tensors, axis, calibration))
    graph = prepared.graph
    ranges = calibrate(cache, graph.SerializeToString(), recipe.tensors_to_calibrate(graph), calibration)
    return graph, recipe.correct(recipe.apply(graph, ranges), graph, calibration, prepared.rescaling)


@pytest.mark.int8
def test_smoothquant_keeps_the_function_and_wins_back_the_outlier_channels_resolution(tmp_path):
    """The smoothed FP32 graph computes the same; quantized, the outliers no longer set the step of
    every channel. With α = 0.5 the outliers' 100× shrinks to about 10×, a step 10× finer (20 dB less
    activation noise); asserted: at least half of that."""
    model, calibration, evaluation = _linear_with_outliers(tmp_path)
    cache = Cache(tmp_path / "cache")
    reference = _run(model, evaluation)
    _, plain = _quantized(model, calibration, cache)
    prepared, smoothed = _quantized(model, calibration, cache, smoothquant=0.5)
    assert np.allclose(_run(prepared, evaluation), reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())
    assert [n.op_type for n in prepared.graph.node] == ["Mul", "MatMul"]
    assert _snr(reference, _run(smoothed, evaluation)) >= _snr(reference, _run(plain, evaluation)) + 10


def test_equalization_keeps_the_function_and_levels_the_depthwise_input(qv_pipeline):
    """dwblock (Conv-BN-ReLU6 → depthwise Conv): after equalization the activation feeding the
    depthwise convolution has the same range in every live channel, ReLU6 became Min(Relu(x), bound
    per channel), and the FP32 outputs are unchanged."""
    from quantverdict.precision.calibrate import RANGE_BITS
    from quantverdict.precision.equalize import equalize

    store = qv_pipeline.store
    model = onnx.load(str(store.fp32_onnx("dwblock")))
    batches = store.calibration_batches("dwblock")
    cache = Cache(Path(store.cache.root) / "equalize-test")
    ranges = lambda graph, tensors, axis: channel_ranges(cache, graph, tensors, axis, batches)  # noqa: E731
    equalized = equalize(onnx.load(str(store.fp32_onnx("dwblock"))), ranges)
    reference, candidate = _run(model, batches), _run(equalized, batches)
    assert np.allclose(candidate, reference, rtol=1e-4, atol=1e-5 * np.abs(reference).max())
    assert "Clip" not in {n.op_type for n in equalized.graph.node} and "Min" in {n.op_type for n in equalized.graph.node}
    depthwise = next(n for n in equalized.graph.node if n.op_type == "Conv" and
                     next(a.i for a in n.attribute if a.name == "group") > 1)
    before = ranges(model.SerializeToString(), [depthwise.input[0]], 1)[depthwise.input[0]]
    after = ranges(equalized.SerializeToString(), [depthwise.input[0]], 1)[depthwise.input[0]]
    live = before > 1e-3 * before.max()
    assert before[live].max() / before[live].min() > 1.5  # there was something to level
    # levelled to float noise, measured through ranges rounded up to RANGE_BITS bits: one step apart at most
    assert after[live].max() / after[live].min() <= 1 + 2.0 ** (1 - RANGE_BITS)


def test_embedding_agreement_measures_cosine_and_ranking():
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(20, 8))
    same = embedding_agreement({"e": reference}, {"e": reference * 3.0})  # scale-free
    assert same["row_cosine_min"] == pytest.approx(1.0) and same["neighbour_agreement"] == 1.0
    assert same["similarity_spearman"] == pytest.approx(1.0)
    shuffled = embedding_agreement({"e": reference}, {"e": reference[rng.permutation(20)]})
    assert shuffled["neighbour_agreement"] < 0.5 and shuffled["similarity_spearman"] < 0.5


USER_METRIC = """import numpy as np


def shift(reference, candidate, labels):
    return {"mean_abs_shift": float(np.mean(np.abs(candidate["scores"] - reference["scores"])))}
"""


def test_a_users_task_metric_is_bounded_by_name(tmp_path):
    """A manifest's ``metric:`` callable gives named scores; ``task_max`` bounds them, and a bound
    on a name the metric does not return fails, naming the ones it does."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    (tmp_path / "user_metric.py").write_text(USER_METRIC)
    entry = ("models:\n  - name: scored\n    build: example_models:make_convnet\n    build_files: []\n"
             "    inputs: [{name: image, shape: [4, 3, 24, 24], range: [0, 1]}]\n    outputs: [scores]\n"
             "    calibration: example_models:calibration_batches\n    metric: user_metric:shift\n"
             "    tolerances:\n      int8: {task_max: {%s: %s}}\n")
    (tmp_path / "models.yaml").write_text(entry % ("mean_abs_shift", "1.0e-9"))
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("scored", "int8", "onnxruntime"))
    assert result.status == "failed" and "task: mean_abs_shift" in result.message
    assert 0 < result.metrics["task_metrics"]["mean_abs_shift"] < 1
    (tmp_path / "models.yaml").write_text(entry % ("recall_at_10", "1.0"))
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("scored", "int8", "onnxruntime"))
    assert result.status == "failed" and "recall_at_10 (not returned; got ['mean_abs_shift'])" in result.message


def test_recipe_settings_come_from_the_manifest_and_the_command_line(tmp_path, token_model):
    from quantverdict.run.settings import recipe_settings

    assert recipe_settings(["smoothquant=0.5", "int8:calibration=mse", "fp8:equalize=true"]) == {
        "int8": {"smoothquant": 0.5, "calibration": "mse"}, "fp8": {"smoothquant": 0.5, "equalize": True}}
    with pytest.raises(HarnessError, match="expected"):
        recipe_settings(["smoothquant"])
    recipes = token_model.recipes
    token_model.models.get("tiny-bert").recipe["int8"] = {"calibration": "max"}  # type: ignore[index]
    assert recipes.recipe("tiny-bert", "int8", "emulated").params()["smoothquant"] is None
    token_model.models.get("tiny-bert").recipe["int8"] = {"smoothquant": 0.7}  # type: ignore[index]
    assert recipes.recipe("tiny-bert", "int8", "emulated").params()["smoothquant"] == 0.7
    token_model.models.get("tiny-bert").recipe["int8"] = {"smoothness": 0.7}  # type: ignore[index]
    with pytest.raises(HarnessError, match="unknown int8 recipe setting.*smoothness"):
        recipes.recipe("tiny-bert", "int8", "emulated")


def test_fp8_leaves_depthwise_convolutions_in_float_as_tensorrt_runs_them(qv_pipeline):
    """TensorRT has no FP8 kernel for convolutions with fewer than 16 channels per group (Model
    Optimizer excludes them): dwblock's depthwise and 3-channel stem stay float in FP8, while INT8,
    which TensorRT does run depthwise (output channels divisible by 8, 3×3), quantizes them all."""
    import onnx as onnx_module

    from quantverdict.precision.coverage import quantized_layers
    from quantverdict.precision.graph import int_attribute

    store = qv_pipeline.store
    counts = {p: quantized_layers(onnx_module.load(str(store.precision_onnx("dwblock", qv_pipeline.recipes.recipe(
        "dwblock", p, "emulated")))))
              for p in ("int8", "fp8")}
    assert (counts["int8"]["layers"], counts["int8"]["quantized"], counts["int8"]["float_layers"]) == (4, 4, [])
    assert (counts["fp8"]["layers"], counts["fp8"]["quantized"]) == (4, 2)  # the pointwise conv and the classifier
    graph = onnx_module.load(str(store.fp32_onnx("dwblock")))
    thin = {n.name for n in graph.graph.node if n.op_type == "Conv" and (
        int_attribute(n, "group", 1) > 1 or n.input[0] in {i.name for i in graph.graph.input})}
    assert set(counts["fp8"]["float_layers"]) == thin


modelopt = pytest.mark.skipif(
    __import__("quantverdict.precision.modelopt", fromlist=["modelopt_python"]).modelopt_python() is None,
    reason="NVIDIA Model Optimizer is not installed: set QUANTVERDICT_MODELOPT_PYTHON to the Python of an environment "
           "with nvidia-modelopt[onnx] (it pins its own onnx and onnxruntime, so it lives apart)")


@modelopt
@pytest.mark.int8
def test_model_optimizer_quantizes_beside_the_harness_and_onnxruntime(qv_pipeline):
    """Model Optimizer's ONNX PTQ (in its own environment) on the harness's calibration set is judged
    like the harness's recipe, and the comparison names where the placements differ."""
    from quantverdict.judge.recipe_comparison import compare_quantizers

    variants = {"harness": {}, "onnxruntime": {"quantizer": "onnxruntime"}, "modelopt": {"quantizer": "modelopt"}}
    results, differences = compare_quantizers(qv_pipeline.store, "resblock", "int8", variants)
    by_label = {r.label: r for r in results}
    assert by_label["modelopt"].metrics["cosine"] > 0.99 and by_label["modelopt"].coverage["quantized"] >= 3
    assert all(set(labels) < set(variants) for labels in differences.values())
    spec = qv_pipeline.models.get("resblock")  # the same quantizer as a model's recipe setting
    spec.recipe["int8"] = {"quantizer": "modelopt"}  # type: ignore[index]
    try:
        case = qv_pipeline.run(Case("resblock", "int8", "onnxruntime"))
    finally:
        spec.recipe.pop("int8")  # type: ignore[attr-defined]
    assert case.status == "passed", case.message
    assert case.metrics["recipe"]["settings"]["quantizer"] == "nvidia-modelopt"


def test_exclude_patterns_come_as_a_list_or_one_command_line_string():
    assert QDQ(INT8).configured({"exclude": "/stem/Conv; /head/*"}).options.exclude == ("/stem/Conv", "/head/*")
    assert QDQ(INT8).configured({"exclude": ["/stem/Conv"]}).options.exclude == ("/stem/Conv",)


def test_an_unknown_quantizer_is_named():
    with pytest.raises(HarnessError, match="unknown int8 quantizer 'brevitas'"):
        QDQ(INT8).configured({"quantizer": "brevitas"})


@pytest.mark.int8
def test_bias_correction_gives_each_layer_fp32s_output_means(qv_pipeline):
    """After correction every quantized layer's per-channel output mean over the calibration set is
    FP32's (to float rounding), where before it was off, and the output is no further from FP32."""
    from quantverdict.precision.bias_correction import _means_session
    from quantverdict.precision.calibrate import calibrate as calibrate_ranges

    store = qv_pipeline.store
    recipe = qv_pipeline.recipes.recipe("digits-cnn", "int8", "emulated")
    corrected_recipe = recipe.configured({"bias_correction": True})
    fp32 = onnx.load(str(store.fp32_onnx("digits-cnn")))
    batches = store.calibration_batches("digits-cnn")
    ranges = calibrate_ranges(store.cache, fp32.SerializeToString(), recipe.tensors_to_calibrate(fp32), batches)
    plain = recipe.apply(fp32, ranges)
    corrected = onnx.load(str(store.precision_onnx("digits-cnn", corrected_recipe)))
    layers = [n.output[0] for n in corrected.graph.node if n.op_type in ("Conv", "Gemm")]
    reference = _means_session(fp32, layers, [])(layers, batches, {})
    before = _means_session(plain, layers, [])(layers, batches, {})
    after = _means_session(corrected, layers, [])(layers, batches, {})
    scale = [np.abs(r).max() for r in reference]
    assert max(np.abs(b - r).max() / s for b, r, s in zip(before, reference, scale)) > 1e-3
    assert max(np.abs(a - r).max() / s for a, r, s in zip(after, reference, scale)) < 1e-4
    evaluation = store.eval_batches("digits-cnn")
    truth = _run(fp32, evaluation)
    assert _snr(truth, _run(corrected, evaluation)) >= _snr(truth, _run(plain, evaluation)) - 0.5


@pytest.mark.int8
def test_compare_recipes_puts_quantizers_side_by_side(qv_pipeline, tmp_path, capsys, monkeypatch):
    """The command judges the harness's recipe, ONNX Runtime's quantize_static and variants on the
    same data, prints them, and writes them with the placement differences as JSON; a fallback
    variant's layers are chosen as a run's are."""
    import json

    from quantverdict.run.cli import main

    monkeypatch.delenv("QUANTVERDICT_MODELOPT_PYTHON", raising=False)
    out = tmp_path / "comparison.json"
    code = main(["compare-recipes", "resblock", "--variant", "mse:calibration=mse",
                 "--variant", "fallback:fallback=0.5", "--json", str(out), "--cache-dir", str(qv_pipeline.cache.root)])
    printed = capsys.readouterr().out
    assert code == 0 and "layers not every quantizer puts in int8" in printed
    document = json.loads(out.read_text())
    labels = [q["label"] for q in document["quantizers"]]
    assert labels[:2] == ["harness", "onnxruntime"] and labels[-2:] == ["mse", "fallback"]
    assert all(q["metrics"]["cosine"] > 0.99 and q["coverage"]["quantized"] >= 3 for q in document["quantizers"][:-1])
    harness, fallback = document["quantizers"][0], document["quantizers"][-1]
    assert fallback["coverage"]["quantized"] == harness["coverage"]["quantized"] - harness["coverage"]["quantized"] // 2
    assert [layer for layer, labels in document["placement_differences"].items() if "fallback" not in labels]


def _on_grid(values: np.ndarray) -> np.ndarray:
    """Values a per-tensor scale of max|x| / 127 represents exactly (so activations quantize losslessly
    and only the weights' rounding is measured)."""
    return np.clip(np.rint(values * 127), -127, 127).astype(np.float32) / 127


def _smooth_images(seed: int, size: tuple[int, ...] = (12, 12), count: int = 4) -> list[dict]:
    """Images (or 1-D signals) of 16 channels, each nearly constant (a level per image and channel, ±5%
    texture), with max |x| exactly 1: the inputs of a depthwise layer deep in a network that sees natural
    images."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        level = rng.uniform(-0.9, 0.9, (8, 16) + (1,) * len(size))
        images = _on_grid(level + rng.normal(0, 0.05, (8, 16, *size)))
        images.reshape(-1)[0] = 1.0
        out.append({"x": images})
    return out


def _layer(op: str, weight: np.ndarray, shape: list, out: list, name: str = "layer", **attributes) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["x", "w"], ["y"], name=name, **attributes)], "layer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                              [numpy_helper.from_array(weight, "w")])
    return make_model(graph, opset=19)


def _rounding_gain(model: onnx.ModelProto, calibration: list[dict], evaluation: list[dict], cache: Cache,
                   fmt=INT8) -> float:
    """dB of output error GPTQ's rounding saves over rounding to nearest, on ``evaluation``."""
    reference = _run(model, evaluation)
    nearest, rounded = (_quantized(model, calibration, cache, fmt, gptq=gptq)[1] for gptq in (False, True))
    return _snr(reference, _run(rounded, evaluation)) - _snr(reference, _run(nearest, evaluation))


@pytest.mark.int8
@pytest.mark.parametrize("kernel, unfolded_values", [((3, 3), 1 << 26), ((9,), 1)], ids=["2-D", "1-D in chunks"])
def test_gptq_rounds_a_cancelling_depthwise_filter_so_its_errors_cancel_too(tmp_path, monkeypatch, kernel,
                                                                             unfolded_values):
    """A trained depthwise filter whose 9 taps sum to ~0 (an edge detector with a large gain) over a nearly
    constant patch: rounded to nearest, the output error is the patch level times the sum of 9 independent
    rounding errors; GPTQ carries each error into the taps not yet rounded, leaving about one tap's.
    That is 10·log10(9) = 9.5 dB less error power; asserted: half of it, on inputs it was not calibrated
    on. The 1-D case also measures its input one sample at a time (what bounds memory on large inputs)."""
    from quantverdict.precision import hessian

    monkeypatch.setattr(hessian, "UNFOLDED_VALUES", unfolded_values)
    rng = np.random.default_rng(0)
    taps = rng.normal(0, 1, (16, 1, *kernel))
    weight = (20 * (taps - taps.mean(axis=tuple(range(2, taps.ndim)), keepdims=True))).astype(np.float32)
    size = (12, 12) if len(kernel) == 2 else (48,)
    shape = [8, 16, *size]
    model = _layer("Conv", weight, shape, shape, group=16, kernel_shape=list(kernel),
                   pads=[k // 2 for k in kernel] * 2)
    gain = _rounding_gain(model, _smooth_images(1, size), _smooth_images(2, size), Cache(tmp_path / "cache"))
    assert gain >= 10 * np.log10(9) / 2


def _correlated_rows(seed: int, inputs: int = 64) -> list[dict]:
    """Rows whose inputs all move together (±1 everywhere): rank-one second moments, exact on every grid."""
    signs = np.where(np.random.default_rng(seed).random((4, 32, 1)) < 0.5, -1.0, 1.0)
    return [{"x": np.repeat(s, inputs, axis=1).astype(np.float32)} for s in signs]


@pytest.mark.fp8
def test_gptq_rounds_fp8_weights_of_a_linear_layer_on_correlated_inputs(tmp_path):
    """MatMul over 64 inputs that move together (each row ±1 everywhere, exact on the E4M3 grid): the
    output error of nearest rounding sums 64 weights' errors, GPTQ's about one; 10·log10(64) = 18 dB,
    asserted: half of it."""
    from quantverdict.precision.grids import FP8_E4M3

    weight = np.random.default_rng(0).normal(0, 0.1, (64, 32)).astype(np.float32)
    model = _layer("MatMul", weight, ["n", 64], ["n", 32], name="")  # an unnamed node, as some exporters write
    gain = _rounding_gain(model, _correlated_rows(1), _correlated_rows(2), Cache(tmp_path / "cache"), FP8_E4M3)
    assert gain >= 10 * np.log10(64) / 2


@pytest.mark.int8
@pytest.mark.filterwarnings("ignore:GPTQ. layer '/6/Gemm' keeps nearest rounding")  # 256 rows, 512 inputs
def test_gptq_keeps_the_recipes_grid_and_scales(qv_pipeline):
    """Only which grid value each weight takes changes: same scales, same layout, weights within the
    format's range, and the model's case still passes its tolerances."""
    store = qv_pipeline.store
    recipe = qv_pipeline.recipes.recipe("digits-cnn", "int8", "emulated")
    plain = onnx.load(str(store.precision_onnx("digits-cnn", recipe)))
    rounded = onnx.load(str(store.precision_onnx("digits-cnn", recipe.configured({"gptq": True}))))
    assert [n.op_type for n in plain.graph.node] == [n.op_type for n in rounded.graph.node]
    before = {i.name: numpy_helper.to_array(i) for i in plain.graph.initializer}
    after = {i.name: numpy_helper.to_array(i) for i in rounded.graph.initializer}
    quantized = [name for name in before if name.endswith("_quantized")]
    assert quantized and all(np.array_equal(before[n], after[n]) for n in before if n.endswith("_scale"))
    assert any(not np.array_equal(before[n], after[n]) for n in quantized)
    assert all(after[n].dtype == np.int8 and np.abs(after[n].astype(int)).max() <= 127 for n in quantized)


@pytest.mark.int8
def test_gptq_rounds_every_linear_layer_of_a_transformer_including_those_sharing_an_input(token_model, tmp_path):
    """Q, K and V read one tensor (one H for the three); each of the encoder's weights is rounded
    (none left at nearest), and the embedding case still passes."""
    store = token_model.store
    recipe = get_recipe("int8").for_target("emulated")  # every layer quantized (no fallback)
    plain = onnx.load(str(store.precision_onnx("tiny-bert", recipe)))
    rounded = onnx.load(str(store.precision_onnx("tiny-bert", recipe.configured({"gptq": True}))))
    before = {i.name: numpy_helper.to_array(i) for i in plain.graph.initializer if i.name.endswith("_quantized")}
    after = {i.name: numpy_helper.to_array(i) for i in rounded.graph.initializer if i.name.endswith("_quantized")}
    assert len(before) >= 12 and before.keys() == after.keys()
    assert [n for n in before if np.array_equal(before[n], after[n])] == []
    gptq = Pipeline(store.cache.root, manifest=tmp_path / "models.yaml", recipe_settings={"int8": {"gptq": True}})
    result = gptq.run(Case("tiny-bert", "int8", "onnxruntime"))
    assert result.status == "passed", result.message
    assert result.metrics["recipe"]["settings"]["gptq"] is True


def _assert_gptq_keeps_nearest(tmp_path: Path, inputs: int, calibration_rows: np.ndarray, message: str) -> None:
    """A MatMul named 'layer' over ``inputs`` inputs, calibrated on ``calibration_rows``: GPTQ warns
    ``message`` and leaves the graph exactly as rounding to nearest makes it."""
    weight = np.random.default_rng(0).normal(0, 0.1, (inputs, 8)).astype(np.float32)
    model = _layer("MatMul", weight, ["n", inputs], ["n", 8])
    calibration, cache = [{"x": calibration_rows.astype(np.float32)}], Cache(tmp_path / "cache")
    _, nearest = _quantized(model, calibration, cache)
    with pytest.warns(UserWarning, match=f"layer 'layer' keeps nearest rounding: {message}"):
        _, rounded = _quantized(model, calibration, cache, gptq=True)
    assert rounded.SerializeToString() == nearest.SerializeToString()


@pytest.mark.int8
def test_gptq_keeps_nearest_rounding_and_names_the_layer_where_its_inputs_are_not_finite(tmp_path):
    """An infinite calibration input (an FP32 activation that overflowed) makes H infinite: that layer keeps
    round-to-nearest (the graph stays usable) and the warning names it. H sums in float64, so the squares of
    finite float32 inputs (≤ 3.4e38² each) cannot overflow it."""
    rows = np.full((16, 8), 1e30)  # squares overflow float32, not float64: GPTQ rounds this one
    rows[3, 2] = np.inf
    _assert_gptq_keeps_nearest(tmp_path, 8, rows, r"its calibration inputs \('x'\) are not finite")


@pytest.mark.int8
def test_gptq_leaves_a_layer_too_wide_for_its_h_at_nearest_and_names_it(tmp_path, monkeypatch):
    from quantverdict.precision import gptq

    monkeypatch.setattr(gptq, "MAX_COLUMNS", 32)
    _assert_gptq_keeps_nearest(tmp_path, 64, np.random.default_rng(1).normal(0, 1, (128, 64)),
                               "64 inputs per output, more than 32")


@pytest.mark.int8
def test_gptq_needs_more_calibration_vectors_than_a_layers_inputs(tmp_path):
    """32 calibration rows for 64 inputs: H = XᵀX has rank ≤ 32, so GPTQ would put the rounding error where
    the calibration set cannot see it; the layer keeps nearest rounding and the warning says why."""
    _assert_gptq_keeps_nearest(tmp_path, 64, np.random.default_rng(1).normal(0, 1, (32, 64)),
                               "32 calibration input vectors for 64 inputs")


@pytest.mark.int8
def test_gptq_names_every_layer_whose_h_is_singular_in_one_warning(tmp_path):
    """Two MatMuls of 64 inputs calibrated on 32 rows: one warning names both, with their vectors and inputs (a
    RegNet's lock printed a warning for each of 24 layers), and both keep nearest rounding."""
    rng = np.random.default_rng(0)
    first, second = rng.normal(0, 0.1, (64, 64)).astype(np.float32), rng.normal(0, 0.1, (64, 8)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
                               helper.make_node("MatMul", ["h", "w2"], ["y"], name="second")], "two",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
                              [numpy_helper.from_array(first, "w1"), numpy_helper.from_array(second, "w2")])
    model, cache = make_model(graph, opset=19), Cache(tmp_path / "cache")
    calibration = [{"x": rng.normal(0, 1, (32, 64)).astype(np.float32)}]
    _, nearest = _quantized(model, calibration, cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, rounded = _quantized(model, calibration, cache, gptq=True)
    said = [str(each.message) for each in caught if "GPTQ" in str(each.message)]
    assert said == ["GPTQ: 2 layers keep nearest rounding: fewer calibration input vectors than inputs make their H "
                    "singular (give them more calibration data): 'first' (32 for 64), 'second' (32 for 64)"]
    assert rounded.SerializeToString() == nearest.SerializeToString()


@pytest.mark.fp4
def test_gptq_rounds_nvfp4_weights_across_their_blocks(tmp_path):
    """NVFP4 (E2M1 in blocks of 16, each with its own E4M3 scale) over 64 inputs that move together:
    nearest rounding sums 64 weights' errors in the output, GPTQ leaves about one (it carries each
    error into the columns not yet rounded, whatever their block's scale); 10·log10(64) = 18 dB,
    asserted: half of it. The blocks' scales and the format's grid are kept."""
    from quantverdict.precision.fp4 import NVFP4Weights, nvfp4_scales, round_e2m1

    weight = np.random.default_rng(0).normal(0, 0.1, (64, 32)).astype(np.float32)
    model = _layer("MatMul", weight, ["n", 64], ["n", 32])
    evaluation = _correlated_rows(2)
    reference = _run(model, evaluation)
    nearest = NVFP4Weights().apply(model)
    rounded = NVFP4Weights().configured({"gptq": True}).apply_batches(model, _correlated_rows(1))
    gain = _snr(reference, _run(rounded, evaluation)) - _snr(reference, _run(nearest, evaluation))
    assert gain >= 10 * np.log10(64) / 2
    values = numpy_helper.to_array(rounded.graph.initializer[0])
    scales = nvfp4_scales(weight, 0)
    assert np.array_equal((round_e2m1(values / scales) * scales).astype(np.float32), values)  # the blocks' grids


@pytest.mark.fp4
@pytest.mark.filterwarnings("ignore:GPTQ. layer '/6/Gemm' keeps nearest rounding")  # 256 rows, 512 inputs
def test_fp4_takes_gptq_from_the_run_and_records_it(qv_pipeline, tmp_path):
    from quantverdict.errors import CalibrationError

    gptq = Pipeline(qv_pipeline.cache.root, recipe_settings={"fp4": {"gptq": True}})
    result = gptq.run(Case("digits-cnn", "fp4", "onnxruntime"))
    assert result.status == "passed", result.message
    assert result.metrics["recipe"]["settings"]["gptq"] is True
    with pytest.raises(CalibrationError, match=r"unknown fp4 recipe setting\(s\) \['smoothquant'\]; known: \['gptq'\]"):
        qv_pipeline.recipes.recipe("digits-cnn", "fp4", "emulated").configured({"smoothquant": 0.5})


def test_compare_recipes_reports_the_others_when_one_quantizer_fails(tmp_path, monkeypatch):
    """ONNX Runtime's quantize_static failing on a graph ("Gather ... indices element out of data bounds",
    seen on a T5 encoder) is that quantizer's row, in one line; every other quantizer is still judged."""
    from quantverdict.judge.recipe_comparison import compare_quantizers
    from quantverdict.precision import ort_cpu

    def fails(self, model, batches):
        raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : indices element out of data bounds\nmore")

    monkeypatch.setattr(ort_cpu.OrtCpuInt8, "apply_batches", fails)
    variants = {"harness": RecipeSettings(), "onnxruntime": RecipeSettings(quantizer="onnxruntime"),
                "mse": RecipeSettings(calibration="mse")}
    pipeline = Pipeline(tmp_path / "cache")  # a cold cache: the quantizer really runs
    results, differences = compare_quantizers(pipeline.store, "resblock", "int8", variants,
                                              functools.partial(pipeline.recipes.with_fallback, "resblock"))
    by_label = {r.label: r for r in results}
    assert by_label["onnxruntime"].error == ("RuntimeError: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : indices "
                                            "element out of data bounds")
    assert not by_label["harness"].error and by_label["harness"].metrics["cosine"] > 0.99
    assert not by_label["mse"].error and by_label["mse"].coverage["quantized"] >= 3


def test_smoothing_scales_do_not_move_with_a_powers_last_bits():
    """Another CPU's power function (numpy's AVX-512 kernels, not glibc's) differs in its last bits: a scale computed
    through exp·log instead of pow stands in for it. Rounded, the scales written into the weights agree except where a
    value lies within those bits of a 10-bit step (then they differ by that one step), so one lock is one graph."""
    from quantverdict.precision.calibrate import RANGE_BITS, portable
    from quantverdict.precision.smoothquant import SCALE_LIMITS, smoothing_scale

    rng = np.random.default_rng(0)
    x_amax, w_amax = np.exp(rng.uniform(-4, 6, 20000)), np.exp(rng.uniform(-6, 1, 20000))
    for alpha in (0.5, 0.8):
        exact = np.power(x_amax, alpha) / np.power(w_amax, 1 - alpha)
        other = np.exp(alpha * np.log(x_amax) - (1 - alpha) * np.log(w_amax))
        assert not np.array_equal(other, exact)  # the stand-in does move the last bits
        mine, yours = (portable(np.clip(value, *SCALE_LIMITS)) for value in (exact, other))
        differ = mine != yours
        assert differ.mean() < 1e-3
        step = np.ldexp(1.0, np.frexp(mine)[1] - RANGE_BITS)
        assert np.allclose(np.abs(mine - yours)[differ], step[differ])
        assert np.array_equal(smoothing_scale(x_amax, w_amax, alpha), mine.astype(np.float32))


@pytest.mark.parametrize("rows, columns, groups", [(48, 40, 1), (1, 9, 8)])
def test_gptq_rounds_layers_of_one_shape_together_as_it_rounds_each_alone(rows, columns, groups):
    """Layers of one shape are rounded in one pass over their columns (a transformer repeats a few shapes dozens of
    times): the grid values are those of each layer rounded alone, bit for bit, in INT8 and in E4M3."""
    from quantverdict.precision.gptq_columns import rounded_columns
    from quantverdict.precision.grids import FP8_E4M3

    rng = np.random.default_rng(0)
    weights = [rng.normal(size=(groups, rows, columns)) * 40 for _ in range(4)]
    inputs = [rng.normal(size=(groups, 2 * columns, columns)) * rng.uniform(0.01, 3, columns) for _ in range(4)]
    hessians = [np.einsum("gni,gnj->gij", x, x) for x in inputs]
    for quantize in (INT8.quantize, FP8_E4M3.quantize):
        together = np.split(rounded_columns(np.concatenate(weights), np.concatenate(hessians), quantize), len(weights))
        for weight, hessian, grid in zip(weights, hessians, together):
            assert np.array_equal(grid, rounded_columns(weight, hessian, quantize))


def _textbook_gptq(weight: np.ndarray, hessian: np.ndarray, quantize) -> np.ndarray:
    """GPTQ as its paper states it (Frantar et al. 2023, algorithm 1 without lazy blocks), for one group: act order,
    1% damping, U from H's explicit inverse, each column's error spread over every later column at once."""
    diagonal = np.diag(hessian).copy()
    order = np.argsort(-diagonal, kind="stable")
    w, h = weight[:, order].copy(), hessian[np.ix_(order, order)].copy()
    h[np.diag_indices_from(h)] += 0.01 * diagonal.mean() + (diagonal[order] == 0)
    upper = np.linalg.cholesky(np.linalg.inv(h)).T  # H⁻¹ = Uᵀ U
    grid = np.zeros_like(w)
    for i in range(w.shape[1]):
        grid[:, i] = quantize(w[:, i])
        w[:, i + 1:] -= np.outer((w[:, i] - grid[:, i]) / upper[i, i], upper[i, i + 1:])
    return grid[:, np.argsort(order)]


@pytest.mark.parametrize("rows, columns, groups", [(24, 300, 2), (1, 9, 16), (40, 17, 1)])  # 300: 128 + 128 + 44
def test_gptq_gives_the_grid_values_of_its_textbook_statement(rows, columns, groups):
    """The rounding's blocks and sub-blocks, and its factor of H⁻¹ from H's own in reverse order, are arithmetic
    reordered, not another method: on layers spanning several blocks and partial ones, every grid value is the one
    the paper's statement gives (an explicit inverse, one column at a time), in INT8 and in E4M3."""
    from quantverdict.precision.gptq_columns import rounded_columns
    from quantverdict.precision.grids import FP8_E4M3

    rng = np.random.default_rng(1)
    weight = rng.normal(size=(groups, rows, columns)) * 30
    inputs = rng.normal(size=(groups, columns, 2 * columns + 8)) * rng.uniform(0.05, 3, (groups, columns, 1))
    hessian = inputs @ inputs.transpose(0, 2, 1)
    for quantize in (INT8.quantize, FP8_E4M3.quantize):
        grid = rounded_columns(weight, hessian, quantize)
        textbook = np.stack([_textbook_gptq(w, h, quantize) for w, h in zip(weight, hessian)])
        assert np.array_equal(grid, textbook)
        assert not np.array_equal(grid, quantize(weight))  # not nearest rounding


@pytest.mark.int8
def test_recipes_that_differ_only_in_their_calibrator_round_each_weight_once(token_model, monkeypatch):
    """GPTQ's rounding is a function of H, the weight, its scales and the grid, not of activation ranges: a second
    calibrator's recipe takes the first one's grid values (no rounding runs), the same bytes a fresh rounding writes."""
    from quantverdict.precision import gptq

    gptq._ROUNDED.clear()
    calls = []
    rounding = gptq.rounded_columns
    monkeypatch.setattr(gptq, "rounded_columns", lambda *args: calls.append(1) or rounding(*args))
    store, base = token_model.store, get_recipe("int8").for_target("emulated")

    def weights(calibration: str) -> dict[str, np.ndarray]:
        made = onnx.load_from_string(store.precision_graph("tiny-bert", base.configured(
            {"gptq": True, "calibration": calibration})).make())
        return {i.name: numpy_helper.to_array(i) for i in made.graph.initializer if i.name.endswith("_quantized")}

    first = weights("max")
    rounded = len(calls)
    kept = weights("percentile")
    assert rounded > 0 and len(calls) == rounded and first.keys() == kept.keys()
    gptq._ROUNDED.clear()
    fresh = weights("percentile")
    assert len(calls) == 2 * rounded and all(np.array_equal(kept[name], fresh[name]) for name in fresh)


CONVOLUTIONS = {  # the input's spatial size, the weight's spatial shape, groups and the Conv's own attributes
    "3x3": ((9, 7), (3, 3), 1, {"pads": [1, 1, 1, 1]}),
    "strided": ((9, 8), (3, 3), 1, {"pads": [1, 0, 1, 1], "strides": [2, 3]}),
    "dilated": ((11, 9), (3, 2), 2, {"pads": [2, 1, 0, 2], "dilations": [2, 3]}),
    "depthwise": ((8, 8), (3, 3), 8, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "pointwise": ((7, 5), (1, 1), 4, {}),
    "1-D": ((13,), (3,), 2, {"pads": [2, 1], "strides": [2], "dilations": [2]}),
    "1-D pointwise": ((11,), (1,), 1, {}),
}


def test_gptqs_input_columns_are_unfolds_bit_for_bit_in_one_buffer():
    """GPTQ's H reads each layer's input columns into one float64 buffer kept for the pass: the same values in the
    same order as unfolding, grouping and widening each into a tensor of its own gave (any padding, stride,
    dilation, group count, 1-D or 2-D, a MatMul's rows), so H is the same to the last bit, the buffer written by a
    larger layer before a smaller one and grown for a larger one after."""
    import torch
    from onnx import helper

    from quantverdict.precision.hessian import LayerInputs, _Columns

    columns = _Columns()
    rng = np.random.default_rng(3)
    for name, (size, kernel, groups, attributes) in [*CONVOLUTIONS.items(), *list(CONVOLUTIONS.items())[::-1]]:
        value = rng.normal(size=(3, 8, *size)).astype(np.float32)
        node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=list(kernel), group=groups, **attributes)
        layer = LayerInputs(node, (6, 8 // groups, *kernel), groups, 8 // groups * int(np.prod(kernel)))
        flat = len(size) == 1
        pads = attributes.get("pads", [0] * 2 * len(size))
        x = torch.nn.functional.pad(torch.from_numpy(value), (pads[0], pads[1]) if flat else (
            pads[1], pads[3], pads[0], pads[2]))
        unfolded = torch.nn.functional.unfold(
            x[:, :, None, :] if flat else x, (1, *kernel) if flat else kernel,
            dilation=[1, *attributes.get("dilations", [1])] if flat else attributes.get("dilations", 1),
            stride=[1, *attributes.get("strides", [1])] if flat else attributes.get("strides", 1))
        width = unfolded.shape[1] // groups
        expected = unfolded.reshape(3, groups, width, -1).permute(1, 2, 0, 3).reshape(groups, width, -1).double()
        held = columns.of(layer, value).cpu()  # copied exactly, on whichever device it is
        assert held.shape == expected.shape and torch.equal(held, expected), name
        assert torch.equal(held @ held.transpose(1, 2), expected @ expected.transpose(1, 2)), name
    rows = rng.normal(size=(2, 5, 8)).astype(np.float32)
    matmul = LayerInputs(helper.make_node("MatMul", ["x", "w"], ["y"]), (8, 4), 1, 8)
    expected = torch.from_numpy(rows.reshape(1, 10, 8).transpose(0, 2, 1)).double()
    assert torch.equal(columns.of(matmul, rows).cpu(), expected)


@pytest.mark.parametrize("settings", [RecipeSettings(), RecipeSettings(calibration="mse", gptq=True),
                                      RecipeSettings(calibration="percentile", equalize=True, fallback=0.1,
                                                     fallback_format=("fp16", "fp32"), exclude=("head*",)),
                                      RecipeSettings(smoothquant=0.5, bias_correction=True, fallback=0.25)])
def test_a_records_recipe_parameters_give_back_the_settings_they_were_made_with(settings):
    """What ``explain`` re-runs with: the settings read back from a recipe's parameters as a record stores them
    (its calibrator's parameters, its lists), each as the run had it or at its default."""
    import json

    params = json.loads(json.dumps(QDQ(INT8).configured(settings).params()))  # as the record's JSON holds them
    recorded = RecipeSettings.recorded(params, "int8")
    assert QDQ(INT8).configured(recorded).params() == QDQ(INT8).configured(settings).params()
    assert set(settings.given()) <= set(recorded.given())
