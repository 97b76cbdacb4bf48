"""GPTQ's float64 matrix work (H's products, the rounding's factorization and block updates) runs on the runner's
GPU where it has one: the same H as the CPU's up to float64's last bits and the same grid values, a cache key of its
own, one variable to keep it on the CPU, and the GPU's timing slot held while it runs."""
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from quantverdict.cache import Cache
from quantverdict.capabilities import GPU, Capabilities, detect
from quantverdict.errors import HarnessError
from quantverdict.precision import get_recipe, hessian, matrix_device
from quantverdict.precision.gptq import roundable
from quantverdict.precision.gptq_columns import rounded_columns
from quantverdict.precision.grids import INT8
from quantverdict.precision.loader import PrecisionGraph
from quantverdict.precision.matrix_device import VARIABLE, matrix_gpu, matrix_key

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="GPTQ's matrix work on a GPU: no CUDA GPU here")


def _net() -> onnx.ModelProto:
    """A depthwise 3 × 3 convolution (groups of 9 columns), a pointwise one (16) and a Gemm (128 columns)."""
    rng = np.random.default_rng(3)
    weights = {"dw": rng.normal(size=(16, 1, 3, 3)), "pw": rng.normal(size=(8, 16, 1, 1)),
               "fc": rng.normal(size=(10, 128))}
    nodes = [helper.make_node("Conv", ["x", "dw"], ["a"], group=16, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "pw"], ["b"]),
             helper.make_node("Flatten", ["b"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "matrix-device", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                     [4, 16, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])],
                              [numpy_helper.from_array(value.astype(np.float32), name)
                               for name, value in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(4)
    return [{"x": rng.normal(size=(4, 16, 4, 4)).astype(np.float32)} for _ in range(count)]


def test_one_variable_chooses_the_device_and_a_bad_value_is_one_line(monkeypatch):
    monkeypatch.setenv(VARIABLE, "tpu")
    with pytest.raises(HarnessError, match=f"^{VARIABLE}='tpu': expected one of auto, cpu, cuda$"):
        matrix_gpu()
    monkeypatch.setenv(VARIABLE, "cpu")
    assert matrix_gpu() is None and matrix_key() == "cpu"
    monkeypatch.setenv(VARIABLE, "cuda")
    if detect().gpu is None:
        with pytest.raises(HarnessError, match="no CUDA GPU that torch sees"):
            matrix_gpu()
    else:
        assert matrix_key() == f"cuda {detect().gpu.name}"


def test_a_graph_gptq_rounds_is_keyed_by_the_device_and_no_other_graph_is(monkeypatch, tmp_path):
    """The device moves H's last bits, and a rounding may follow: a GPU's graph is never a CPU's from the cache. The
    GPU here is the driver listing's answer (what the key reads), not a device the test computes on."""
    path = tmp_path / "net.onnx"
    onnx.save(_net(), path)
    base = get_recipe("int8").for_target("emulated")

    def key(settings: dict, device: str) -> str:
        monkeypatch.setenv(VARIABLE, device)
        graph = PrecisionGraph(lambda: path, base.configured(settings), lambda: _batches(2), lambda: "data",
                               Cache(tmp_path / "cache"), "net")
        return graph.key()

    monkeypatch.setattr(matrix_device, "detect", lambda: Capabilities(GPU("NVIDIA H100 80GB HBM3", (9, 0))))
    assert key({"gptq": True}, "cpu") != key({"gptq": True}, "auto")
    assert key({}, "cpu") == key({}, "auto")


@needs_cuda
@pytest.mark.gpu
def test_on_the_gpu_h_and_the_grid_values_are_the_cpus(monkeypatch):
    """H measured on the GPU is the CPU's up to float64's last bits (each set's a key of its own: none is taken for
    the other's), and the rounding, given one H, the same grid values; each holds the GPU's timing slot."""
    from quantverdict import gpu_slot

    model, batches = _net(), _batches(3)
    layers = roundable(model)
    slots = []
    real_slot = gpu_slot.timing_slot
    monkeypatch.setattr(matrix_device, "timing_slot", lambda gpu: slots.append(gpu) or real_slot(gpu))
    found = {}
    for device in ("cpu", "cuda"):
        monkeypatch.setenv(VARIABLE, device)
        key, sums = hessian.measured(model, layers, batches, lambda: layers)
        found[device] = key, [sums[layer.key][0] for layer in layers]
    assert found["cpu"][0] != found["cuda"][0] and slots and all(slot is not None for slot in slots)
    for mine, theirs in zip(found["cpu"][1], found["cuda"][1]):  # an entry sums 192 products at most, whose sizes
        # add up to no more than H's largest (Cauchy-Schwarz): any order's sum is within 192 × 2⁻⁵² ≈ 4e-14 of it
        assert np.abs(mine - theirs).max() <= 1e-12 * np.abs(mine).max()
    rng = np.random.default_rng(5)
    weight = rng.normal(size=(2, 24, 300)) * 30
    inputs = rng.normal(size=(2, 300, 608)) * rng.uniform(0.05, 3, (2, 300, 1))
    moments = inputs @ inputs.transpose(0, 2, 1)
    grids = {}
    for device in ("cpu", "cuda"):
        monkeypatch.setenv(VARIABLE, device)
        grids[device] = rounded_columns(weight, moments, INT8.quantize)
    assert np.array_equal(grids["cpu"], grids["cuda"])


@needs_cuda
@pytest.mark.gpu
def test_the_gpus_memory_running_out_is_one_line_that_names_the_way_out():
    """A search stops on it (:class:`ResourceError`), as on a worker killed for memory: no traceback, and no work moved
    to the CPU behind a key that names the GPU."""
    from quantverdict.errors import ResourceError

    with pytest.raises(ResourceError, match=f"^GPTQ's matrix work ran out of memory on the GPU .*: {VARIABLE}=cpu"):
        with matrix_device.held(torch.device("cuda")):
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # a pebibyte
