"""ONNX export: named I/O, a working dynamic batch, and ONNX Runtime ≡ PyTorch in FP32."""
import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from quantverdict.export import load_onnx

MODELS = ["mlp", "cnn", "resblock", "dwblock", "transformer-block", "digits-cnn", "mobilenetv3", "resnet18"]


@pytest.mark.fp32
@pytest.mark.onnxruntime
@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_matches_torch_at_another_batch_size(name, qv_pipeline):
    spec = qv_pipeline.models.get(name)
    path = qv_pipeline.store.fp32_onnx(name)
    model = load_onnx(path)
    assert [i.name for i in model.graph.input] == [i.name for i in spec.inputs]
    assert [o.name for o in model.graph.output] == list(spec.outputs)
    batch = spec.inputs[0].shape[0] + 3  # not the batch size the export traced
    feed = spec.sample_batches(1, seed=11, batch=batch)[0]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, feed)[0]
    with torch.no_grad():
        want = qv_pipeline.store.module(name)(*[torch.from_numpy(feed[i.name]) for i in spec.inputs]).numpy()
    assert got.shape == want.shape and got.shape[0] == batch
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_export_is_cached_by_content(qv_pipeline, tmp_path):
    from quantverdict.cache import Cache
    from quantverdict.export import export_onnx

    cache = Cache(tmp_path)
    spec = qv_pipeline.models.get("cnn")
    module = spec.build().eval()
    first = export_onnx(spec, module, cache)
    assert export_onnx(spec, module, cache) == first
    assert (cache.stats["onnx.miss"], cache.stats["onnx.hit"]) == (1, 1)
    with torch.no_grad():
        module[0].weight[0, 0, 0, 0] += 1.0  # one weight changes → a new export
    assert export_onnx(spec, module, cache) != first
    assert cache.stats["onnx.miss"] == 2
    assert onnx.load(str(first)).opset_import[0].version == 19


def _opset17_user_model(qv_pipeline, tmp_path, ir_version: int):
    """The built-in cnn exported at opset 17 (what most exporters write) as a user's ONNX file, stamped
    with ``ir_version``, declared in a manifest."""
    import io
    import warnings

    from quantverdict.run.pipeline import Pipeline

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(qv_pipeline.store.module("cnn"), torch.zeros(4, 3, 32, 32), buffer, input_names=["input"],
                          output_names=["logits"], opset_version=17, dynamo=False,
                          dynamic_axes={"input": {0: "batch"}})
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = ir_version
    onnx.save(model, str(tmp_path / "net17.onnx"))
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: net17\n    onnx: net17.onnx\n    inputs: [{name: input, shape: [4, 3, 32, 32]}]\n"
        "    outputs: [logits]\n    task: classification\n    calibration: synthetic\n")
    return Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")


def test_graphs_are_written_at_the_lowest_ir_version_their_opsets_need(qv_pipeline, tmp_path):
    """onnx writes its newest IR version (1.23: 14), which older runtimes refuse (onnxruntime 1.30 reads
    13 at most): the harness's graphs, and a user's file stamped with the newest, carry the lowest one."""
    from quantverdict.export.compat import lowest_ir

    exported = onnx.load(str(qv_pipeline.store.fp32_onnx("cnn")))
    assert exported.ir_version == lowest_ir(exported) == 9  # opset 19
    pipeline = _opset17_user_model(qv_pipeline, tmp_path, onnx.IR_VERSION)
    readable = onnx.load(str(pipeline.store.fp32_onnx("net17")))
    assert readable.ir_version == 8 < onnx.IR_VERSION  # opset 17 needs IR 8
    int8 = onnx.load(str(pipeline.store.precision_onnx("net17", pipeline.recipes.recipe("net17", "int8", "emulated"))))
    assert int8.ir_version == lowest_ir(int8)


@pytest.mark.fp8
def test_an_opset_17_graph_is_converted_for_the_float8_recipe(qv_pipeline, tmp_path):
    from quantverdict.export.compat import opset_of
    from quantverdict.run.cases import Case

    pipeline = _opset17_user_model(qv_pipeline, tmp_path, 8)
    result = pipeline.run(Case("net17", "fp8", "onnxruntime"))
    assert result.status == "passed", result.message
    fp8 = onnx.load(str(pipeline.store.precision_onnx("net17", pipeline.recipes.recipe("net17", "fp8", "emulated"))))
    assert opset_of(fp8) == 19 and opset_of(onnx.load(str(pipeline.store.fp32_onnx("net17")))) == 17


def test_a_graph_the_converter_cannot_take_is_refused_naming_both_opsets():
    from onnx import TensorProto, helper

    from quantverdict.errors import ModelFileError
    from quantverdict.export.compat import at_opset

    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelFileError, match=r"net\.onnx is at opset 17; the fp8 recipe needs opset 19, and onnx's "
                                             r"version converter could not convert it .*export it at opset 19"):
        at_opset(model, 19, "the fp8 recipe", "net.onnx")


class _Held(torch.nn.Module):
    """Records whether autograd still holds an activation it saved for backward once the forward has let go of it."""

    def __init__(self):
        super().__init__()
        self.linear, self.held = torch.nn.Linear(8, 8), []

    def forward(self, x):
        import weakref

        hidden = self.linear(x)
        out = hidden * hidden  # a product saves its factors for the backward pass
        alive = weakref.ref(hidden)
        del hidden
        self.held.append(alive() is not None)
        return out


def test_the_export_traces_with_gradients_on_and_holds_no_activation_for_backward(tmp_path):
    """Traced with gradients off, attention would take PyTorch's fused path, which no exporter knows; traced with them
    on, autograd holds every activation until the trace ends (a ResNet-50 at batch 256: tens of GB)."""
    from quantverdict.cache import Cache
    from quantverdict.export import export_onnx
    from quantverdict.models.spec import InputSpec, ModelSpec

    spec = ModelSpec(name="held", inputs=[InputSpec("x", (4, 8))], outputs=["y"], build=_Held)
    module = _Held().eval()
    export_onnx(spec, module, Cache(tmp_path))
    assert module.held == [False]  # the one forward: the trace's, the inputs checked on it
    with torch.enable_grad():
        module(torch.zeros(4, 8))
    assert module.held[-1] is True  # the same forward outside the export: autograd holds it
