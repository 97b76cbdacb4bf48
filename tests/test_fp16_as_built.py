"""An FP16 verdict describes the graph the target builds: a BatchNormalization's variance that exceeds FP16's range is
folded as TensorRT folds it (into its Conv, else a scale and shift), and a constant that still exceeds the range is
named by its consequence, beside the activations."""
import io
import textwrap
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantverdict.export.batchnorm import fold_batchnorms
from quantverdict.precision.floating import FP16_RECIPE
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline

VARIANCE = 9.79e7  # a trained text detector's first BatchNormalization holds this in every channel


def _detector(folded_by_exporter: bool) -> onnx.ModelProto:
    """A small map network (Conv, BatchNormalization, ReLU, Conv, Sigmoid) whose BatchNormalization holds a variance
    of :data:`VARIANCE` (its scale matched, so the activations are ordinary), exported by torch with its Conv-BN
    fusion off, as converters that keep BatchNormalization write it; a standalone BatchNormalization on the input."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.BatchNorm2d(3), nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.Conv2d(16, 1, 3, padding=1), nn.Sigmoid()).eval()
    with torch.no_grad():
        net[2].running_var.fill_(VARIANCE)
        net[2].running_mean.uniform_(-0.1, 0.1)
        net[2].weight.copy_(VARIANCE ** 0.5 * torch.empty(16).uniform_(0.5, 1.5))
        net[0].running_var.uniform_(0.5, 2.0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.rand(2, 3, 16, 16),), buffer, input_names=["image"], output_names=["map"],
                          opset_version=17, dynamo=False, do_constant_folding=folded_by_exporter,
                          dynamic_axes={"image": {0: "batch"}})
    return onnx.load_from_string(buffer.getvalue())


def _run(model: onnx.ModelProto, image: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"image": image})[0]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_batchnorm_is_folded_into_its_conv_and_a_standalone_one_into_a_scale_and_shift():
    model = _detector(folded_by_exporter=False)
    assert [n.op_type for n in model.graph.node].count("BatchNormalization") == 2
    image = np.random.default_rng(0).uniform(0, 1, (2, 3, 16, 16)).astype(np.float32)
    before = _run(model, image)
    assert fold_batchnorms(model) == 1
    onnx.checker.check_model(model)
    convs = {out for n in model.graph.node if n.op_type == "Conv" for out in n.output}
    left = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(left) == 1 and left[0].input[0] not in convs  # the input's, standalone: a scale and shift
    assert max(np.abs(onnx.numpy_helper.to_array(i)).max() for i in model.graph.initializer) < 65504
    np.testing.assert_allclose(_run(model, image), before, rtol=1e-5, atol=1e-6)


@pytest.mark.fp16
def test_fp16_judges_the_graph_with_its_batchnorm_folded_as_tensorrt_builds_it(tmp_path):
    """Stored as written, the variance is clipped to 65,504 and the map collapses (the hazard is real); the harness
    judges the folded graph, as TensorRT and ONNX Runtime's optimiser build it, and FP16 passes."""
    model = _detector(folded_by_exporter=False)
    image = np.random.default_rng(1).uniform(0, 1, (4, 3, 16, 16)).astype(np.float32)
    as_written = FP16_RECIPE.apply_impl(onnx.load_from_string(model.SerializeToString()), {})
    assert _cosine(_run(as_written, image), _run(model, image)) < 0.99
    onnx.save(model, tmp_path / "detector.onnx")
    (tmp_path / "models.yaml").write_text(textwrap.dedent("""\
        models:
          - name: detector
            onnx: detector.onnx
            inputs: [{name: image, shape: [4, 3, 16, 16], range: [0, 1]}]
            outputs: [map]
            calibration: synthetic
        """))
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("detector", "fp16",
                                                                                      "onnxruntime"))
    assert result.status == "passed", result.message
    assert result.metrics["metrics"]["map"]["cosine"] > 0.999


SCALED = textwrap.dedent("""\
    import torch
    from torch import nn


    class Scaled(nn.Module):
        \"\"\"Divides each channel by a stored constant, one beyond FP16's range: no folding removes it.\"\"\"

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 1, 1)
            self.register_buffer("scale", torch.tensor([0.5, 1.0, 2.0e5, 0.5]).view(1, 4, 1, 1))
            with torch.no_grad():  # channel 2 reaches ~1e4, within FP16's range, and matters once divided
                self.conv.weight[2].mul_(2.0e4)
                self.conv.bias[2].mul_(2.0e4)

        def forward(self, image):
            return self.head(self.conv(image) / self.scale)


    def net():
        return Scaled().eval()
    """)


@pytest.mark.fp16
def test_a_constant_beyond_fp16s_range_is_named_by_its_consequence(tmp_path):
    """The constant is clipped to 65,504 where the graph is stored in FP16 and its channel grows threefold: the
    output breaks, with no activation beyond the range, and the failure's first line names the constant and its
    reader, not a metric."""
    (tmp_path / "scaled.py").write_text(SCALED)
    (tmp_path / "models.yaml").write_text(textwrap.dedent("""\
        models:
          - name: scaled
            build: scaled:net
            inputs: [{name: image, shape: [4, 3, 8, 8], range: [0, 1]}]
            outputs: [map]
            calibration: synthetic
        """))
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("scaled", "fp16", "onnxruntime"))
    assert result.status == "failed"
    overflow = result.metrics["overflow"]
    assert [(entry["tensor"], entry["op"], entry["breaks_output"]) for entry in overflow["all"]] == [
        ("scale", "Div", True)]
    first = result.message.splitlines()[0]
    assert first.startswith("scaled-fp16-onnxruntime: overflow: the constant 'scale' (read by /Div, Div) holds "
                            "200,000,")
    assert first.endswith("stored in FP16 it is clipped to it and the output breaks; rescale it, or keep /Div (its "
                          "reader) in FP32"), first


TWO_STREAMS = textwrap.dedent("""\
    import torch
    from torch import nn


    class TwoStreams(nn.Module):
        \"\"\"Two streams whose activations both exceed FP16's range (as a T5 encoder's residual stream and FFN outputs
        do): each breaks the output stored alone, and keeping either one alone in FP32 cures nothing.\"\"\"

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False)
            self.a_out, self.b_out = nn.Linear(8, 4), nn.Linear(8, 4)
            with torch.no_grad():
                for layer in (self.a, self.b):
                    layer.weight.uniform_(0.5e4, 1.0e4)
                for layer in (self.a_out, self.b_out):
                    layer.weight.mul_(1.0e-5)

        def forward(self, x):
            return self.a_out(self.a(x)) + self.b_out(self.b(x))
    """)


@pytest.mark.fp16
def test_an_fp16_overflow_names_the_tensors_whose_keeping_cures_the_output_verified(tmp_path):
    """Both streams break the output stored alone, and keeping either alone cures nothing: the failure names the two
    to keep, checked by running the graph with every other overflowing tensor stored in FP16 (not the first tensor in
    graph order, whose keeping alone would leave the output broken)."""
    (tmp_path / "streams.py").write_text(TWO_STREAMS)
    (tmp_path / "models.yaml").write_text(textwrap.dedent("""\
        models:
          - name: streams
            build: streams:TwoStreams
            inputs: [{name: x, shape: [4, 8], range: [1, 2]}]
            outputs: [y]
            calibration: synthetic
        """))
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("streams", "fp16",
                                                                                      "onnxruntime"))
    assert result.status == "failed"
    overflow = result.metrics["overflow"]
    assert overflow["cure"]["tensors"] == ["/a/MatMul_output_0", "/b/MatMul_output_0"]
    assert overflow["cure"]["output_cosine"] > 0.9995 and all(entry["breaks_output"] for entry in overflow["all"])
    lines = result.message.splitlines()
    assert lines[0].startswith("streams-fp16-onnxruntime: overflow: 2 tensors exceed FP16's largest finite value "
                               "65,504; keeping 2 nodes in FP32 cures the output"), lines[0]
    assert lines[1].startswith("  keep /a/MatMul (MatMul) in FP32: its output '/a/MatMul_output_0' reaches ")
    assert lines[2].startswith("  keep /b/MatMul (MatMul) in FP32: ")
