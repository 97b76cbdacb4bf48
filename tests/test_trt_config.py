"""Full TensorRT: which build each version gets, checked without TensorRT (it is not on PyPI).

Only the plan and Polygraphy's lazy loader chain are tested here; no fake ``tensorrt`` module
stands in for engines. Building and running need a GPU runner with TensorRT installed.
"""
from pathlib import Path

import pytest

from quantverdict.backends.trt import build_plan, make_loaders
from quantverdict.backends.trt_engine import BuildOptions, profile_from_spec
from quantverdict.errors import UnsupportedError

pytestmark = pytest.mark.tensorrt


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16", "int8", "fp8"])
def test_tensorrt_11_is_strongly_typed_from_the_recipe_graph(precision):
    plan = build_plan(precision, "11.0.0.1")
    assert plan.strongly_typed and plan.graph == "recipe" and not plan.implicit_int8_calibration
    assert plan.flags == ({"tf32"} if precision == "tf32" else set())


def test_tensorrt_10_uses_weak_typing_flags_and_implicit_int8():
    assert build_plan("fp16", "10.9.0").flags == {"fp16"} and build_plan("fp16", "10.9.0").graph == "fp32"
    assert build_plan("bf16", "10.9.0").flags == {"bf16"}
    int8 = build_plan("int8", "10.9.0")
    assert (int8.graph, int8.flags, int8.implicit_int8_calibration, int8.strongly_typed) == ("fp32", {"int8"}, True, False)
    fp8 = build_plan("fp8", "10.9.0")
    assert (fp8.graph, fp8.flags) == ("recipe", {"fp8"})


def test_older_tensorrt_is_refused_by_name():
    with pytest.raises(UnsupportedError, match="TensorRT 8.6.1 is not supported"):
        build_plan("int8", "8.6.1")


def test_loader_chain_carries_flags_profile_and_timing_cache(qv_pipeline, tmp_path):
    spec = qv_pipeline.models.get("resnet18")
    options = BuildOptions(profiles=profile_from_spec(spec))
    assert options.profiles == (("input", (1, 3, 224, 224), (4, 3, 224, 224), (8, 3, 224, 224)),)
    loaders = make_loaders(Path("model.onnx"), build_plan("fp16", "10.9.0"), options, tmp_path / "timing.cache")
    config, network = loaders._config, loaders._network
    assert (config.fp16, config.int8, config.bf16, config.tf32) == (True, False, False, False)
    assert not network.strongly_typed  # TensorRT 10 legacy path: weak typing with builder flags
    assert repr(config.profiles[0]) == "Profile().add('input', min=(1, 3, 224, 224), opt=(4, 3, 224, 224), max=(8, 3, 224, 224))"
    assert config.timing_cache_path == loaders.timing_cache_path == str(tmp_path / "timing.cache")
    strongly = make_loaders(Path("m.onnx"), build_plan("int8", "11.0.0"), options, tmp_path / "t.cache")
    assert strongly._network.strongly_typed and not strongly._config.int8
    with pytest.raises(UnsupportedError, match="implicit INT8 needs a calibrator"):
        make_loaders(Path("m.onnx"), build_plan("int8", "10.9.0"), options, tmp_path / "t.cache")


def test_tensorrt_10_builds_int8_from_the_recipe_graph_where_ranges_do_not_describe_it():
    """A user's own quantized graph, or a recipe that chooses weights (GPTQ) or rewrites the graph
    (SmoothQuant): implicit INT8 would quantize the FP32 graph by itself, so the engine is built from
    the Q/DQ graph (explicit quantization) with the INT8 flag, as FP8 is."""
    int8 = build_plan("int8", "10.9.0", ranges_suffice=False)
    assert (int8.graph, int8.flags, int8.implicit_int8_calibration, int8.strongly_typed) == ("recipe", {"int8"}, False, False)
    assert build_plan("fp16", "10.9.0", ranges_suffice=False).graph == "fp32"


def test_int8_with_layers_in_fp8_needs_fp8s_gpu_and_tensorrt_10s_fp8_flag(qv_pipeline):
    """An INT8 recipe whose fallback layers are FP8 Q/DQ (``fallback_format: fp8``) runs only where FP8 does: the case
    is skipped on an A100 with the reason, runs on an H100, and TensorRT 10 (weak typing) gets both flags."""
    from dataclasses import replace

    from quantverdict.backends.trt_engine import gpu_requirement
    from quantverdict.capabilities import GPU, Capabilities

    spec = replace(qv_pipeline.models.get("resnet18"), recipe={"int8": {"fallback": 0.1, "fallback_format": "fp8"}})
    ampere, hopper = (Capabilities(GPU(name, cc), {}) for name, cc in (("A100", (8, 0)), ("H100", (9, 0))))
    assert gpu_requirement(spec, "int8", ampere) == ("int8 keeps its fallback layers in FP8 (fallback_format: fp8): "
                                                     "fp8 needs compute capability ≥ 8.9; this GPU (A100) is 8.0")
    assert gpu_requirement(spec, "int8", hopper) is None
    assert gpu_requirement(spec, "int8", Capabilities(None, {})) == (
        "int8 keeps its fallback layers in FP8 (fallback_format: fp8): fp8 needs an NVIDIA GPU (compute capability "
        "≥ 8.9); none found")  # the most demanding need, where none is met
    assert gpu_requirement(qv_pipeline.models.get("resnet18"), "int8", ampere) is None
    plan = build_plan("int8", "10.9.0", ranges_suffice=False, also=frozenset({"fp8"}))
    assert (plan.graph, plan.flags) == ("recipe", {"int8", "fp8"})
    from quantverdict.backends.trt_engine import target_requirement
    from quantverdict.precision import get_recipe

    params = get_recipe("int8").configured({"fallback": 0.1, "fallback_format": "fp8"}).params()  # a --recipe-option
    assert target_requirement("int8", params, (8, 0), "this GPU (A100)") == gpu_requirement(spec, "int8", ampere)
    assert target_requirement("int8", params, (9, 0)) is None


@pytest.mark.parametrize("settings, suffice", [({}, True), ({"calibration": "mse"}, True), ({"gptq": True}, False),
                                               ({"smoothquant": 0.5}, False), ({"bias_correction": True}, False),
                                               ({"exclude": ["conv1"]}, False), ({"quantizer": "onnxruntime"}, False)])
def test_which_int8_recipes_ranges_describe(settings, suffice):
    from quantverdict.precision import get_recipe

    assert get_recipe("int8").configured(settings).ranges_describe_it is suffice


def test_a_users_own_quantized_graph_gives_tensorrt_no_ranges(qv_pipeline, tmp_path):
    from quantverdict.run.pipeline import Pipeline

    (tmp_path / "models.yaml").write_text(f"""models:
  - name: mine
    onnx: {qv_pipeline.store.fp32_onnx("digits-cnn")}
    inputs: [{{name: input, shape: [8, 1, 28, 28]}}]
    outputs: [logits]
    calibration: synthetic
    quantized: {{int8: {qv_pipeline.store.fp32_onnx("digits-cnn")}}}
    recipe: {{fp8: {{calibration: max}}}}
""")
    executor = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").executor
    assert executor.artifacts("mine", "int8", "tensorrt").ranges is None
    assert executor.artifacts("mine", "fp8", "tensorrt").ranges is not None
