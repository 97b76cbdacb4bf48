"""A graph of integer operators (``MatMulInteger``, ``ConvInteger``, ``QLinearMatMul``, ``QLinearConv``) is judged
on exact integer arithmetic, the same on every CPU; its layers are counted and the graph is described as it is."""
import hashlib
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from quantverdict.judge.integer import evaluate_exact
from quantverdict.judge.semantics import EXACT, evaluate_semantics, evaluator
from quantverdict.precision.describe import describe_quantization
from quantverdict.precision.coverage import quantized_layers
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline
from user_repo import speaker_manifest, written


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], initializers: dict[str, np.ndarray],
           output_type: int = TensorProto.INT32) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", output_type, None)],
                              [numpy_helper.from_array(np.asarray(value), name) for name, value in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _random_conv(rng: np.random.Generator, qlinear: bool) -> tuple[onnx.ModelProto, np.ndarray]:
    group = int(rng.choice([1, 2, 4]))
    cin, cout, kernel = group * int(rng.integers(1, 4)), group * int(rng.integers(1, 4)), int(rng.integers(1, 4))
    attributes = {"group": group, "strides": [int(rng.integers(1, 3))] * 2, "dilations": [int(rng.integers(1, 3))] * 2}
    if rng.random() < 0.3:
        attributes["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    else:
        attributes["pads"] = [int(p) for p in rng.integers(0, 3, 4)]
    x = rng.integers(0, 256, (2, cin, 9, 8)).astype(np.uint8)
    weight = rng.integers(-127, 128, (cout, cin // group, kernel, kernel)).astype(np.int8)
    per_channel = rng.random() < 0.5
    w_zero = (rng.integers(-3, 4, cout) if per_channel else rng.integers(-3, 4, ())).astype(np.int8)
    x_zero = np.asarray(rng.integers(0, 256), np.uint8)
    inputs = [helper.make_tensor_value_info("x", TensorProto.UINT8, None)]
    if not qlinear:
        node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], **attributes)
        return _model([node], inputs, {"w": weight, "xz": x_zero, "wz": w_zero}), x
    w_scale = (rng.uniform(0.01, 0.1, cout) if per_channel else rng.uniform(0.01, 0.1, ())).astype(np.float32)
    constants = {"xs": np.float32(0.02), "xz": x_zero, "w": weight, "ws": w_scale, "wz": np.zeros_like(w_zero),
                 "ys": np.float32(rng.uniform(0.5, 4.0)), "yz": np.uint8(128),
                 "b": rng.integers(-5000, 5000, cout).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], **attributes)
    return _model([node], inputs, constants, TensorProto.UINT8), x


@pytest.mark.parametrize("qlinear", [False, True], ids=["ConvInteger", "QLinearConv"])
def test_exact_convolutions_equal_onnxs_reference_on_random_configurations(qlinear):
    """Groups, strides, dilations, explicit and automatic padding, per-tensor and per-channel zero points: bit for
    bit what ONNX's reference implementation (integer loops) computes."""
    rng = np.random.default_rng(7 + qlinear)
    for _ in range(25):
        model, x = _random_conv(rng, qlinear)
        expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
        got = evaluate_exact(model, [{"x": x}])["y"]
        assert got.dtype == expected.dtype and np.array_equal(got, expected), model.graph.node[0]


def _saturating_matmul() -> tuple[onnx.ModelProto, np.ndarray]:
    """Activations over the whole uint8 range times full-range int8 weights: the pairs of products a u8×s8
    int16 instruction adds overflow int16 (what AVX2's integer kernels compute without VNNI)."""
    rng = np.random.default_rng(0)
    model = _model([helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
                   [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, 384])],
                   {"b": rng.integers(-127, 128, (384, 384)).astype(np.int8)})
    return model, rng.integers(0, 256, (64, 384)).astype(np.uint8)


def test_exact_matmul_is_the_integer_product_and_is_what_judges_the_graph(tmp_path):
    model, a = _saturating_matmul()
    path = tmp_path / "matmul.onnx"
    onnx.save(model, str(path))
    expected = (a.astype(np.int64) @ numpy_helper.to_array(model.graph.initializer[0]).astype(np.int64))
    assert evaluator(model) == EXACT
    assert np.array_equal(evaluate_semantics(path, [{"a": a}])["y"], expected)


AVX2_SCRIPT = textwrap.dedent("""\
    import hashlib, sys
    import numpy as np, onnx, onnxruntime as ort
    from quantverdict.judge.integer import evaluate_exact
    model = onnx.load(sys.argv[1]); a = np.load(sys.argv[2])
    options = ort.SessionOptions(); options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
    exact, runtime = evaluate_exact(model, [{"a": a}])["y"], session.run(None, {"a": a})[0]
    print(hashlib.sha256(exact.tobytes()).hexdigest(), int((runtime != exact).sum()))
    """)


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                    reason="emulating an AVX2-only CPU needs qemu-user (apt-get install qemu-user; .ci/run does)")
def test_exact_semantics_are_the_same_on_an_emulated_avx2_only_cpu(tmp_path):
    """Under QEMU's Haswell (AVX2, no AVX-512, no VNNI) the exact evaluation gives the same bytes as here, whatever
    ONNX Runtime's integer kernel computes there (its unfused MatMulInteger saturates int16 pairs on such a CPU:
    seen 49,088 of 49,152 elements off, up to 97,020)."""
    model, a = _saturating_matmul()
    onnx.save(model, str(tmp_path / "matmul.onnx"))
    np.save(tmp_path / "a.npy", a)
    (tmp_path / "check.py").write_text(AVX2_SCRIPT)
    emulated = subprocess.run(["qemu-x86_64", "-cpu", "Haswell", sys.executable, str(tmp_path / "check.py"),
                               str(tmp_path / "matmul.onnx"), str(tmp_path / "a.npy")],
                              capture_output=True, text=True, timeout=600, check=True)
    digest, runtime_off = emulated.stdout.split()
    here = evaluate_exact(model, [{"a": a}])["y"]
    assert digest == hashlib.sha256(here.tobytes()).hexdigest()
    print(f"ONNX Runtime's unfused MatMulInteger on the emulated AVX2 CPU: {runtime_off} of {here.size} elements "
          f"differ from exact integer arithmetic")


@pytest.fixture(scope="module")
def dynamic_encoder(tmp_path_factory, request) -> Path:
    """The built-in transformer block quantized by ONNX Runtime's ``quantize_dynamic`` (MatMulInteger, per-channel
    symmetric int8 weights, activations quantized per batch): a user's own integer-operator graph."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    pipeline = request.getfixturevalue("qv_pipeline")
    path = tmp_path_factory.mktemp("dynamic") / "encoder-int8.onnx"
    quantize_dynamic(str(pipeline.store.fp32_onnx("transformer-block")), str(path), weight_type=QuantType.QInt8,
                     per_channel=True)
    return path


def test_an_integer_operator_graph_is_counted_and_described_as_it_is(dynamic_encoder):
    graph = onnx.load(str(dynamic_encoder))
    integer_layers = sum(node.op_type == "MatMulInteger" for node in graph.graph.node)
    coverage = quantized_layers(graph)
    assert integer_layers > 0 and coverage["quantized"] == integer_layers
    assert coverage["layers"] == integer_layers + len(coverage["float_layers"])
    assert describe_quantization(graph) == {
        "operators": {"DynamicQuantizeLinear": integer_layers, "MatMulInteger": integer_layers},
        "activations": "dynamic", "activation_zero_points": "asymmetric", "weights": "per-channel",
        "weight_zero_points": "symmetric", "storage": ["int8", "uint8"]}


@pytest.mark.int8
def test_a_users_integer_graph_is_judged_on_exact_arithmetic_with_its_layers_counted(qv_pipeline, dynamic_encoder,
                                                                                    tmp_path):
    fp32 = qv_pipeline.store.fp32_onnx("transformer-block")
    (tmp_path / "models.yaml").write_text(textwrap.dedent(f"""\
        models:
          - name: encoder
            onnx: {fp32}
            inputs: [{{name: tokens, shape: [4, 16, 64], range: [-3, 3]}}]
            outputs: [hidden]
            task: regression
            calibration: synthetic
            quantized: {{int8: {dynamic_encoder}}}
        """))
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=tmp_path / "models.yaml")
    result = pipeline.run(Case("encoder", "int8", "onnxruntime"))
    recipe = result.metrics["recipe"]
    assert recipe["evaluator"] == EXACT and recipe["user_graph"] == str(dynamic_encoder)
    assert recipe["coverage"]["quantized"] == recipe["coverage"]["layers"] - len(recipe["coverage"]["float_layers"]) > 0
    assert recipe["settings"]["activations"] == "dynamic" and recipe["settings"]["weights"] == "per-channel"
    exact = evaluate_exact(onnx.load(str(dynamic_encoder)), pipeline.store.eval_batches("encoder"))
    recipe = pipeline.recipes.recipe("encoder", "int8", "emulated")
    assert np.array_equal(pipeline.store.semantics("encoder", recipe)["hidden"], exact["hidden"])


def _embedding_encoder():
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.up, self.down = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

        def forward(self, tokens):
            return self.down(torch.relu(self.up(self.embed(tokens))))

    torch.manual_seed(0)
    return Encoder()


def _with_dequantized_table(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its embedding table stored as int8 behind a per-row ``DequantizeLinear`` (what ONNX Runtime's
    dynamic quantizer writes for a quantized ``Gather``)."""
    [table] = [init for init in model.graph.initializer if len(init.dims) == 2 and init.dims[0] == 64]
    values = numpy_helper.to_array(table)
    scale = (np.abs(values).max(axis=1) / 127).astype(np.float32)
    stored = np.clip(np.rint(values / scale[:, None]), -127, 127).astype(np.int8)
    model.graph.initializer.remove(table)
    model.graph.initializer.extend([numpy_helper.from_array(stored, "table_q"), numpy_helper.from_array(scale, "table_s"),
                                    numpy_helper.from_array(np.zeros(64, np.int8), "table_z")])
    model.graph.node.insert(0, helper.make_node("DequantizeLinear", ["table_q", "table_s", "table_z"], [table.name],
                                                axis=0))
    return model


def test_integer_graphs_get_exact_semantics_at_every_opset(tmp_path):
    """ONNX Runtime's quantize_dynamic output of one encoder exported at opsets 13, 17, 18 and 21, with its
    embedding table dequantized as that quantizer writes it: onnx's reference evaluator has DequantizeLinear from
    opset 19 only, and the semantics are exact, the same bits at every opset."""
    import torch
    from onnx import version_converter
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from exporters import torch_export

    exported = {}
    for at in (13, 17, 18, 21):
        model = torch_export(_embedding_encoder(), (torch.zeros(2, 6, dtype=torch.long),), ["tokens"], ["out"], min(at, 18))
        exported[at] = version_converter.convert_version(model, at) if at > 18 else model
    outputs = {}
    for at, model in exported.items():
        source, target = tmp_path / f"fp32-{at}.onnx", tmp_path / f"int8-{at}.onnx"
        onnx.save(model, str(source))
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)
        quantized = _with_dequantized_table(onnx.load(str(target)))
        assert next(e.version for e in quantized.opset_import if e.domain in ("", "ai.onnx")) == at
        onnx.save(quantized, str(target))
        assert evaluator(quantized) == EXACT
        tokens = {"tokens": np.random.default_rng(3).integers(0, 64, (4, 6))}
        outputs[at] = evaluate_semantics(target, [tokens])["out"]
    assert all(np.array_equal(outputs[at], outputs[21]) for at in outputs)


LSTM_NET = """import torch
from torch import nn


class Speaker(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm, self.head = nn.LSTM(16, 32, batch_first=True), nn.Linear(32, 8)

    def forward(self, frames):
        return self.head(self.lstm(frames)[0][:, -1])


def net():
    return Speaker().eval()
"""


@pytest.mark.int8
def test_a_contrib_integer_lstm_is_counted_recorded_and_labelled_as_the_cpus_kernels(qv_pipeline, tmp_path,
                                                                                     monkeypatch):
    """ONNX Runtime's ``quantize_dynamic`` writes an LSTM as ``com.microsoft`` ``DynamicQuantizeLSTM``, which ONNX does
    not define: the graph is judged by ONNX Runtime's integer kernels, and labelled so (not "Q/DQ as written"); the
    LSTM is among the recorded operators and counted as a quantized layer."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from quantverdict.judge.semantics import KERNELS

    written(tmp_path, monkeypatch, {"speaker.py": LSTM_NET, "models.yaml": speaker_manifest("speaker")})
    fp32 = Pipeline(qv_pipeline.cache.root, manifest=tmp_path / "models.yaml").store.fp32_onnx("speaker")
    quantize_dynamic(str(fp32), str(tmp_path / "speaker-int8.onnx"), weight_type=QuantType.QInt8)
    graph = onnx.load(str(tmp_path / "speaker-int8.onnx"))
    assert "DynamicQuantizeLSTM" in describe_quantization(graph)["operators"]
    assert evaluator(graph) == KERNELS
    with open(tmp_path / "models.yaml", "a") as manifest:
        manifest.write("    quantized: {int8: speaker-int8.onnx}\n")
    result = Pipeline(qv_pipeline.cache.root, manifest=tmp_path / "models.yaml").run(Case("speaker", "int8",
                                                                                          "onnxruntime"))
    recipe = result.metrics["recipe"]
    assert recipe["evaluator"] == KERNELS and "DynamicQuantizeLSTM" in recipe["settings"]["operators"], recipe
    assert recipe["coverage"]["kinds"]["DynamicQuantizeLSTM"] == [1, 1]
