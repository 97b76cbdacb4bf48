"""TensorRT-RTX engines built for real, ahead of time, on this (GPU-less) machine."""
from dataclasses import replace

import pytest
from onnx import TensorProto, helper

from quantverdict.backends.trt_engine import BuildOptions, build_engine
from quantverdict.cache import Cache
from quantverdict.capabilities import package_version
from quantverdict.errors import UnsupportedError
from quantverdict.run.pipeline import Pipeline

pytestmark = [
    pytest.mark.tensorrt_rtx,
    pytest.mark.skipif(package_version("tensorrt-rtx") is None,
                       reason="tensorrt-rtx not installed (pip install -e '.[rtx]')"),
]
MODELS = ["mlp", "cnn", "resblock", "dwblock", "transformer-block", "resnet18", "resnet50", "resnet101",
          "mobilenetv3", "digits-cnn"]
PRECISIONS = ["fp32", "fp16", "bf16", "int8", "fp8"]
SM89 = (8, 9)


@pytest.mark.parametrize("precision", [pytest.param(p, marks=getattr(pytest.mark, p)) for p in PRECISIONS])
@pytest.mark.parametrize("model", MODELS)
def test_engine_builds_for_sm89(model, precision, qv_pipeline):
    artifacts = qv_pipeline.executor.artifacts(model, precision, "tensorrt_rtx")
    engine = qv_pipeline.backend("tensorrt_rtx").build(artifacts, SM89)
    assert engine.stat().st_size > 10_000
    assert artifacts.recipe.params().get("mode", "native") == "native"  # real low-precision graph


@pytest.mark.int8
def test_second_build_is_a_cache_hit_and_other_inputs_rebuild(tmp_path):
    pipeline = Pipeline(tmp_path / "cache")
    backend = pipeline.backend("tensorrt_rtx")
    first = backend.build(pipeline.executor.artifacts("cnn", "int8", "tensorrt_rtx"), SM89)
    again = backend.build(pipeline.executor.artifacts("cnn", "int8", "tensorrt_rtx"), SM89)
    assert again == first and pipeline.cache.stats["engine.hit"] == 1 and pipeline.cache.stats["engine.miss"] == 1
    other_target = backend.build(pipeline.executor.artifacts("cnn", "int8", "tensorrt_rtx"), (12, 0))
    other_precision = backend.build(pipeline.executor.artifacts("cnn", "fp16", "tensorrt_rtx"), SM89)
    assert len({first, other_target, other_precision}) == 3 and pipeline.cache.stats["engine.miss"] == 3


@pytest.mark.fp8
def test_fp8_for_sm86_is_predicted_and_really_fails(qv_pipeline):
    backend = qv_pipeline.backend("tensorrt_rtx")
    artifacts = qv_pipeline.executor.artifacts("cnn", "fp8", "tensorrt_rtx")
    with pytest.raises(UnsupportedError, match=r"fp8 needs compute capability ≥ 8\.9; the build target is 8\.6"):
        backend.build(artifacts, (8, 6))
    import tensorrt_rtx

    # Bypassing the prediction, the builder itself refuses: the matrix matches reality.
    with pytest.raises(UnsupportedError, match="could not build an engine for compute capability 8.6"):
        build_engine(tensorrt_rtx, "tensorrt_rtx", artifacts.onnx_path(), "fp8",
                     BuildOptions(target_cc=(8, 6)), Cache(qv_pipeline.cache.root))


def test_parser_error_names_node_and_op_and_declared_ops_skip(tmp_path, qv_pipeline):
    import tensorrt_rtx

    from quantverdict.export.compat import make_model

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["x_bf16"], to=TensorProto.BFLOAT16),
         helper.make_node("HardSwish", ["x_bf16"], ["y_bf16"], name="act"),
         helper.make_node("Cast", ["y_bf16"], ["y"], to=TensorProto.FLOAT)],
        "hardswish-bf16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    path = tmp_path / "hardswish.onnx"
    path.write_bytes(make_model(graph, opset=19).SerializeToString())
    with pytest.raises(UnsupportedError, match=r"hardswish\.onnx \(bf16 recipe\): node 1 'act' \(op HardSwish\)") as info:
        build_engine(tensorrt_rtx, "tensorrt_rtx", path, "bf16", BuildOptions(target_cc=SM89), Cache(tmp_path / "c"))
    assert info.value.ops == ("HardSwish",)
    spec = replace(qv_pipeline.models.get("mobilenetv3"), unsupported_ops={"tensorrt_rtx": ["HardSwish"]})
    assert spec.declared_unsupported("tensorrt_rtx", info.value.ops)
    assert not spec.declared_unsupported("tensorrt", info.value.ops)  # declared for one backend only
    assert not qv_pipeline.models.get("mobilenetv3").declared_unsupported("tensorrt_rtx", info.value.ops)


@pytest.mark.int8
@pytest.mark.parametrize("wider", ["fp16", "fp8"])
@pytest.mark.parametrize("model", ["resblock", "transformer-block"])
def test_int8_with_its_fallback_layers_in_fp16_or_fp8_builds_for_sm89(model, wider, qv_pipeline):
    """TensorRT builds the Q/DQ graph whose fallback layers compute in FP16 (strongly typed: the graph says so) or
    in FP8 beside the INT8 layers; FP8 layers are refused for a target without FP8 (8.6), and say why."""
    pipeline = Pipeline(qv_pipeline.cache.root, recipe_settings={"int8": {"fallback": 0.5, "fallback_format": wider}})
    artifacts = pipeline.executor.artifacts(model, "int8", "tensorrt_rtx")
    assert artifacts.recipe.options.native and artifacts.recipe.options.fallback_layers
    engine = pipeline.backend("tensorrt_rtx").build(artifacts, SM89)
    assert engine.stat().st_size > 10_000
    if wider == "fp8":
        with pytest.raises(UnsupportedError, match=r"int8 keeps its fallback layers in FP8 \(fallback_format: fp8\): "
                                                   r"fp8 needs compute capability ≥ 8\.9; the build target is 8\.6"):
            pipeline.backend("tensorrt_rtx").build(artifacts, (8, 6))
