"""A graph's inner tensors read in parts that fit the memory: the parts cover the tensors asked for in order, each
within its budget by the sizes shape inference gives (the sizes of the values read, to the byte), and every value is
the one read with all tensors at once, on torch's export of a torchvision network; the verdicts' diagnoses (a failed
case's first divergence, its overflow by consequence) are the same read in parts."""
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from exporters import torch_export
from quantverdict.judge.diagnose import first_divergence, input_dependent
from quantverdict.judge.overflow import overflows
from quantverdict.precision import exposing
from quantverdict.precision.exposing import cut_to, exposed, from_node, parts, read, value_bytes
from quantverdict.precision.graph import float_tensors

EVERYTHING = 1 << 62  # a budget every part fits: one part


@pytest.fixture(scope="module")
def resnet() -> onnx.ModelProto:
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None)
    return torch_export(net, (torch.zeros(2, 3, 64, 64),), ["image"], ["logits"], opset=17)


def _activations(model: onnx.ModelProto) -> list[str]:
    floats, live = float_tensors(model), input_dependent(model.graph)
    return [out for node in model.graph.node for out in node.output if out in floats and out in live]


def _batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"image": rng.uniform(0, 1, (2, 3, 64, 64)).astype(np.float32)} for _ in range(count)]


def test_parts_cover_the_tensors_in_order_each_within_its_budget_by_the_values_true_sizes(resnet):
    names, [batch] = _activations(resnet), _batches(1)
    sizes = value_bytes(resnet, batch)
    assert {name: sizes[name] for name in names} == {name: value.nbytes for name, value in
                                                     read(resnet, names, batch).items()}
    budget = sum(sizes[name] for name in names) // 5
    split = parts(resnet, names, batch, budget)
    assert [name for part in split for name in part] == names
    assert len(split) >= 5
    assert all(len(part) == 1 or sum(sizes[name] for name in part) <= budget for part in split)
    assert parts(resnet, names, batch, EVERYTHING) == [names]


def test_values_read_in_parts_are_those_read_at_once_each_tensor_meeting_the_batches_in_order(resnet):
    names, batches = _activations(resnet), _batches(2)
    budget = sum(value_bytes(resnet, batches[0])[name] for name in names) // 7
    at_once: dict[tuple[int, str], np.ndarray] = {}
    for index, values in exposed(resnet, names, batches, EVERYTHING):
        at_once.update({(index, name): value for name, value in values.items()})
    met: dict[str, list[int]] = {}
    for index, values in exposed(resnet, names, batches, budget):
        for name, value in values.items():
            assert np.array_equal(value, at_once[index, name]), name
            met.setdefault(name, []).append(index)
    assert met == {name: [0, 1] for name in names}


def test_the_next_batch_is_read_while_the_caller_holds_this_ones_and_a_failed_run_is_the_callers_error(resnet):
    """Read ahead where two batches' values fit as one part (the test above compares them with values read in parts,
    which are read one batch at a time): the thread is there while the caller holds batch 0's values and gone after;
    a batch that cannot run raises from the loop that asked for it, after the batches before it."""
    def reading_ahead() -> bool:
        return any(thread.name.startswith("quantverdict-read-ahead") for thread in threading.enumerate())

    names, batches = _activations(resnet)[:4], _batches(3)
    values = exposed(resnet, names, batches, EVERYTHING)
    assert next(values)[0] == 0 and reading_ahead()
    assert [index for index, _ in values] == [1, 2] and not reading_ahead()
    wrong = {"image": np.zeros((2, 4, 64, 64), np.float32)}  # 4 channels into a 3-channel Conv
    seen = []
    with pytest.raises(Exception, match="(?i)channel|dimension|shape|invalid"):
        for index, _ in exposed(resnet, names, [batches[0], wrong, batches[1]], EVERYTHING):
            seen.append(index)
    assert seen == [0] and not reading_ahead()


def test_a_part_runs_only_the_nodes_it_needs(resnet):
    names = _activations(resnet)
    first = cut_to(resnet, names[:3])
    assert len(first.graph.node) <= 3 < len(resnet.graph.node)
    assert [value.name for value in first.graph.output] == names[:3]


def test_a_branch_reading_an_outer_tensor_keeps_the_node_that_makes_it():
    """The ``If``'s branches read ``scaled`` from the graph around them, not through the node's inputs."""
    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["scaled"], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [None, 4])])

    nodes = [helper.make_node("Mul", ["x", "three"], ["scaled"]),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["wide"]),
             helper.make_node("If", ["wide"], ["y"], then_branch=branch("then", "Relu"),
                              else_branch=branch("other", "Neg"))]
    graph = helper.make_graph(nodes, "outer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
                              [numpy_helper.from_array(np.array(3.0, np.float32), "three"),
                               numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    x = np.array([[1.0, -2.0, 3.0, 4.0]], np.float32)
    assert {node.output[0] for node in cut_to(model, ["y"]).graph.node} == {"scaled", "total", "wide", "y"}
    assert np.array_equal(read(model, ["y"], {"x": x})["y"], np.maximum(3 * x, 0))
    assert np.array_equal(read(model, ["y"], {"x": -x})["y"], 3 * x)


def test_the_rest_of_a_graph_fed_what_comes_before_it_computes_the_graphs_outputs_to_the_bit(resnet):
    batch = _batches(1)[0]
    whole, count = read(resnet, ["logits"], batch)["logits"], len(resnet.graph.node)
    for start in (0, count // 3, 2 * count // 3, count - 2):
        rest, fed = from_node(resnet, start, batch)
        assert len(rest.graph.node) == count - start and [value.name for value in rest.graph.output] == ["logits"]
        assert np.array_equal(read(rest, ["logits"], fed)["logits"], whole), start
    assert list(from_node(resnet, 0, batch)[1]) == ["image"]


def _overflowing() -> onnx.ModelProto:
    """x → +0 → ×1e5 (past FP16's 65,504) → Relu → ×1e-5, beside a Softmax over x: y and p."""
    nodes = [helper.make_node("Add", ["x", "zero"], ["shifted"]),
             helper.make_node("Mul", ["shifted", "big"], ["loud"], name="amplify"),
             helper.make_node("Relu", ["loud"], ["r"]),
             helper.make_node("Mul", ["r", "small"], ["y"], name="quiet"),
             helper.make_node("Softmax", ["x"], ["p"], axis=-1)]
    graph = helper.make_graph(nodes, "overflowing", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8]),
                               helper.make_tensor_value_info("p", TensorProto.FLOAT, [None, 8])],
                              [numpy_helper.from_array(np.array(1e5, np.float32), "big"),
                               numpy_helper.from_array(np.array(1e-5, np.float32), "small"),
                               numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_failed_cases_diagnoses_are_the_same_read_a_tensor_at_a_time(resnet, tmp_path, monkeypatch):
    """The first divergence (a weight of the third stage perturbed) and the overflow by consequence, with a budget
    that fits every value and with one that fits a tensor at a time."""
    fp32, candidate, hot = tmp_path / "fp32.onnx", tmp_path / "candidate.onnx", tmp_path / "hot.onnx"
    onnx.save(resnet, fp32)
    changed = onnx.ModelProto()
    changed.CopyFrom(resnet)
    conv = next(node for node in changed.graph.node if node.op_type == "Conv" and "layer3" in node.name)
    weight = next(init for init in changed.graph.initializer if init.name == conv.input[1])
    weight.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(weight), weight.name))
    onnx.save(changed, candidate)
    onnx.save(_overflowing(), hot)
    x = np.random.default_rng(1).uniform(0.5, 1, (4, 8)).astype(np.float32)
    found = [(first_divergence(fp32, candidate, _batches(1)[0], 0.99),
              overflows(hot, [{"x": x}], 65504.0, TensorProto.FLOAT16, 0.99))]
    monkeypatch.setattr(exposing, "BUDGET_SHARE", 1 << 62)  # a budget of 0 bytes: each tensor a part
    found.append((first_divergence(fp32, candidate, _batches(1)[0], 0.99),
                  overflows(hot, [{"x": x}], 65504.0, TensorProto.FLOAT16, 0.99)))
    assert found[0] == found[1]
    divergence, overflow = found[0]
    assert divergence is not None and divergence["node"] == conv.name
    assert overflow is not None and overflow["tensor"] == "loud" and overflow["breaks_output"]


MEMORY_PROBE = """
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from quantverdict.precision.exposing import exposed

count, shape = 24, (64, 1024, 128)
nodes = [helper.make_node("Add", ["x" if i == 0 else f"y{i - 1}", "one"], [f"y{i}"]) for i in range(count)]
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info(f"y{count - 1}", TensorProto.FLOAT, list(shape))],
                          [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
batch = {"x": np.zeros(shape, np.float32)}

def peak():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024

before, peaks = peak(), {}
for _, values in exposed(model, [f"y{i}" for i in range(count)], [batch], int(sys.argv[1])):
    for name, value in values.items():  # the loop's last value is still held while the next part is read
        peaks[name] = float(value.max())
assert peaks == {f"y{i}": float(i + 1) for i in range(count)}, peaks
print(peak() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak memory from Linux's /proc")
def test_values_read_in_parts_are_never_all_held_at_once():
    """Twenty-four 32 MB activations of a chain read eight at a time (a 256 MB budget), the caller's loop holding the
    last value of a part while the next is read: the process's peak grows by at most a part's values, that held
    value and the two a pass computes from one another (352 MB), not all 768 MB, nor two parts' (the arena of ONNX
    Runtime's session stays while any value it made is held: 564 MB measured with it)."""
    size = 64 * 1024 * 128 * 4
    grown = int(subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(8 * size)], capture_output=True, text=True,
                               check=True).stdout)
    assert grown <= 8 * size + 3 * size, f"{grown / 2 ** 20:.0f} MB"


def test_sessions_whose_runs_are_not_timed_leave_no_thread_spinning_and_timed_ones_keep_their_default():
    """A graph's semantics and its calibration values are read by sessions whose threads sleep between kernels (their
    busy-wait burned 10-20% more CPU for no time saved); a session a latency is timed on keeps ONNX Runtime's own."""
    from quantverdict.backends.onnxrt import OnnxRuntimeRunner
    from quantverdict.precision.exposing import NO_SPINNING

    graph = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]), opset_imports=[helper.make_opsetid("", 17)])
    [(key, off)] = NO_SPINNING.items()
    assert exposing.as_written_session(graph).get_session_options().get_session_config_entry(key) == off
    with OnnxRuntimeRunner(graph.SerializeToString(), ["CPUExecutionProvider"], optimize=False) as runner:
        assert runner.session.get_session_options().get_session_config_entry(key) == off
    with OnnxRuntimeRunner(graph.SerializeToString(), ["CPUExecutionProvider"], optimize=True) as runner:
        with pytest.raises(Exception, match=key):  # not set: ONNX Runtime's default
            runner.session.get_session_options().get_session_config_entry(key)
