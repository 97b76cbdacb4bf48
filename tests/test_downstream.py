"""Each layer quantized alone is evaluated from where its graph differs from the prepared graph, its float nodes
optimised: the outputs are the whole graph's as written up to the float kernels' rounding, on the built-in networks and
on graphs torch's exporters wrote (a torchvision network, a transformer encoder layer through the dynamo exporter), in
groups of any size, and the part evaluated is smaller than the graph."""
from pathlib import Path

import numpy as np
import onnx
import pytest

from exporters import torch_export
from float_kernels import FLOAT_FLOOR_DB, assert_errors_agree
from quantverdict.export.compat import serialized
from quantverdict.judge import layers_alone
from quantverdict.judge.downstream import Reference
from quantverdict.judge.layer_errors import Errors
from quantverdict.judge.semantics import unkept_semantics
from quantverdict.judge.sensitivity import weighted_layers
from quantverdict.precision import get_recipe
from quantverdict.run.pipeline import Pipeline

pytestmark = [pytest.mark.int8, pytest.mark.filterwarnings("ignore:GPTQ")]


def _foreign(folder: Path, name: str) -> Path:
    """A graph torch wrote, declared in a manifest: torchvision's MobileNetV3-small (random weights, TorchScript
    exporter, opset 13) or a transformer encoder layer (dynamo exporter)."""
    import torch

    torch.manual_seed(0)
    path = folder / f"{name}.onnx"
    if name == "mobilenet":
        import torchvision

        module = torchvision.models.mobilenet_v3_small(num_classes=10)
        onnx.save(torch_export(module, (torch.zeros(2, 3, 64, 64),), ["x"], ["y"], 13), str(path))
        inputs = "[{name: x, shape: [2, 3, 64, 64]}]"
    else:
        pytest.importorskip("onnxscript", reason="torch's dynamo ONNX exporter needs onnxscript")
        module = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
        program = torch.onnx.export(module, (torch.zeros(2, 8, 32),), dynamo=True, input_names=["x"],
                                    output_names=["y"])
        program.save(str(path), external_data=False)
        inputs = "[{name: x, shape: [2, 8, 32]}]"
    (folder / "models.yaml").write_text(f"models:\n  - name: {name}\n    onnx: {path.name}\n    inputs: {inputs}\n"
                                        "    outputs: [y]\n    task: regression\n    calibration: synthetic\n")
    return folder / "models.yaml"


CASES = [("transformer-block", {"smoothquant": 0.5, "gptq": True}), ("resblock", {"gptq": True}),
         ("mobilenet", {"gptq": True}), ("encoder-layer", {"calibration": "percentile"})]


@pytest.mark.parametrize("model,settings", CASES, ids=[case[0] for case in CASES])
def test_each_layer_from_its_cut_gives_the_whole_graphs_outputs(tmp_path, model, settings):
    manifest = _foreign(tmp_path, model) if model in ("mobilenet", "encoder-layer") else None
    store = Pipeline(tmp_path / "cache", manifest=manifest).store
    recipe = get_recipe("int8").configured(settings).with_options(fallback_layers=())
    layers = [node.name for node in weighted_layers(store, model, recipe)]
    graphs = store.precision_graph(model, recipe).layer_graphs()
    batches = store.batches(model, "calibration")
    reference = Reference(graphs.prepared)
    parts = [reference.part(graphs.model(layer)) for layer in layers]
    assert all(part is not None and part.graph is not None for part in parts), layers
    whole = len(graphs.prepared.graph.node)
    sizes = [len(onnx.load_from_string(part.graph).graph.node) for part in parts]
    assert sizes[-1] < whole and sum(sizes) < whole * len(layers), (sizes, whole)
    fp32 = unkept_semantics(serialized(graphs.prepared), batches, threads=1)
    for budget in (1, 1 << 30):  # a group per layer; one group for all
        found: dict[int, dict[str, np.ndarray]] = {}
        layers_alone.evaluate(graphs, layers, range(len(layers)), batches, budget, found.__setitem__)
        assert sorted(found) == list(range(len(layers)))
        for number, layer in enumerate(layers):
            expected = unkept_semantics(graphs.graph(layer), batches, threads=1)
            assert found[number].keys() == expected.keys()
            assert_errors_agree(Errors.of(fp32, found[number]), Errors.of(fp32, expected), fp32, (layer, budget))


def test_float_nodes_are_optimised_and_quantizers_run_as_written(tmp_path):
    """A Q/DQ convolution ONNX Runtime fuses into an integer kernel with every optimisation on keeps its quantizers
    as written under the options layers alone are evaluated with (its float convolution in the CPU's blocked layout):
    what the graph means, up to the float kernels' rounding."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    from quantverdict.precision.exposing import as_written_options, quantizers_as_written_options

    rng = np.random.default_rng(0)
    codes = numpy_helper.from_array(rng.integers(-127, 128, (16, 8, 3, 3)).astype(np.int8), "w")
    scalars = [numpy_helper.from_array(np.array(value, dtype), name) for name, value, dtype in [
        ("sx", 0.02, np.float32), ("zx", 0, np.int8), ("sw", 0.004, np.float32), ("sy", 0.05, np.float32)]]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zx"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "sy", "zx"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zx"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16, 16, 16])],
                              [codes, *scalars])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()
    feed = {"x": rng.normal(0, 1, (4, 8, 16, 16)).astype(np.float32)}
    outputs, kinds = {}, {}
    for name, options in [("written", as_written_options()), ("ours", quantizers_as_written_options()),
                          ("fused", onnxruntime.SessionOptions())]:
        options.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
        outputs[name] = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(
            None, feed)[0]
        kinds[name] = {node.op_type for node in onnx.load(str(tmp_path / f"{name}.onnx")).graph.node}
    assert "QLinearConv" in kinds["fused"] and "QLinearConv" not in kinds["ours"], kinds
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= kinds["ours"]
    apart = np.linalg.norm((outputs["ours"] - outputs["written"]).astype(np.float64))
    assert apart <= np.linalg.norm(outputs["written"].astype(np.float64)) * 10 ** (-FLOAT_FLOOR_DB / 20)


def test_a_part_onnx_runtime_does_not_load_is_evaluated_whole(tmp_path):
    """A part ONNX Runtime refuses (here: bytes that are no graph) goes back to be evaluated whole; the others of its
    group are evaluated from their cut as before."""
    import dataclasses

    from quantverdict.judge.downstream import Group

    store = Pipeline(tmp_path / "cache").store
    recipe = get_recipe("int8").with_options(fallback_layers=())
    layers = [node.name for node in weighted_layers(store, "resblock", recipe)]
    graphs, batches = store.precision_graph("resblock", recipe).layer_graphs(), store.batches("resblock", "calibration")
    reference = Reference(graphs.prepared)
    good, bad = reference.part(graphs.model(layers[0])), reference.part(graphs.model(layers[1]))
    assert good is not None and bad is not None
    found: dict[int, dict[str, np.ndarray]] = {}
    whole: list[int] = []
    Group([(0, good), (1, dataclasses.replace(bad, graph=b"no graph"))]).evaluate(reference, batches,
                                                                                found.__setitem__, whole.append)
    assert whole == [1] and list(found) == [0]
    fp32 = unkept_semantics(serialized(graphs.prepared), batches, threads=1)
    expected = unkept_semantics(graphs.graph(layers[0]), batches, threads=1)
    assert_errors_agree(Errors.of(fp32, found[0]), Errors.of(fp32, expected), fp32, layers[0])


MANY_PARTS = '''
import sys
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from quantverdict.backends.onnxrt import OnnxRuntimeRunner
from quantverdict.judge import downstream
from quantverdict.judge.downstream import Group, Reference
from quantverdict.resources import peak_memory_mb

if sys.argv[1] == "kept":  # the baseline: each session keeps its buffers in its arena between runs
    downstream._floats_optimised = lambda graph: OnnxRuntimeRunner(graph, ["CPUExecutionProvider"], optimize=True,
                                                                   threads=1, pooled=True, quantizers_as_written=True)

rng = np.random.default_rng(0)
nodes, weights, previous, channels = [], [], "x", 3
for index, out in enumerate([32, 32, 64, 64]):
    weights.append(numpy_helper.from_array(rng.normal(0, 0.1, (out, channels, 3, 3)).astype(np.float32), f"w{index}"))
    nodes += [helper.make_node("Conv", [previous, f"w{index}"], [f"c{index}"], pads=[1, 1, 1, 1], name=f"conv{index}"),
              helper.make_node("Relu", [f"c{index}"], [f"r{index}"], name=f"relu{index}")]
    previous, channels = f"r{index}", out
nodes.append(helper.make_node("GlobalAveragePool", [previous], ["pooled"], name="pool"))  # a small output to hold
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 128, 256])],
                          [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, None)], weights)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)  # every runtime reads it
reference, group = Reference(model), Group()
for number in range(12):  # each a copy whose first layer's weights moved: its downstream is the whole graph
    changed = onnx.ModelProto.FromString(model.SerializeToString())
    changed.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        numpy_helper.to_array(model.graph.initializer[0]) * (1 + number / 100), "w0"))
    group.parts.append((number, reference.part(changed)))
batches = [{"x": rng.random((2, 3, 128, 256), dtype=np.float32)}]
before = peak_memory_mb()
group.evaluate(reference, batches, lambda number, outputs: None, lambda number: None)
print(before, peak_memory_mb())
'''


def test_a_group_of_parts_holds_one_runs_buffers_not_one_per_session(tmp_path):
    """Twelve layers' graphs evaluated as one group hold twelve ONNX Runtime sessions at once; each run's buffers are
    freed when it ends, so the group's peak grows by a few runs' activations, not one per session held (a text
    detector's workers were killed at 5.6 GB each). Side by side with sessions that keep their buffers (ONNX Runtime's
    default), in processes of their own: less than half the growth (twelve sessions against the reference's pass, a
    part's and what the allocator keeps of them); each at least the largest tensor a pass holds (an allocator that
    frees each tensor at its last use holds little more: ONNX Runtime 1.30 on the H100 host grew 44 MB)."""
    import subprocess
    import sys

    growth = {}
    for mode in ("kept", "freed"):
        proc = subprocess.run([sys.executable, "-c", MANY_PARTS, mode], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        before, after = map(float, proc.stdout.split())
        growth[mode] = after - before
    largest_mb = 2 * 128 * 256 * 4 * 64 / 2 ** 20  # a 64-channel Conv's output, batch 2
    assert largest_mb < growth["freed"] < growth["kept"] / 2, (growth, largest_mb)
