"""Weighted layers inside an ``If``'s branches (a choice the data makes at run time) quantized as top-level ones are:
each branch calibrated on the batches that take it, Q/DQ placed in its body, the case judged on every layer."""
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantverdict.precision.bodies import branch_ranges, branches, flattened
from quantverdict.precision.calibrate import calibrate, held_values
from quantverdict.precision.calibrators import Calibrator
from quantverdict.cache import Cache
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.grids import INT8
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline
from test_before_search import _branches, _manifest


def _batches(sign: float, gain: float, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Batches whose every sum has ``sign`` (so all take one branch of :func:`_branches`' If), of magnitude ``gain``."""
    rng = np.random.default_rng(seed)
    return [{"x": (sign * np.abs(rng.normal(0, gain, (4, 8)))).astype(np.float32)} for _ in range(count)]


def _run(model: onnx.ModelProto, batch: dict) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, batch)[0]


def test_a_flattened_branch_computes_what_the_if_computes_where_it_takes_it():
    model = _branches()
    [(node, _, _), _] = list(branches(model))
    for attribute, sign in (("then_branch", 1.0), ("else_branch", -1.0)):
        batch = _batches(sign, 1.0, 1, 3)[0]
        assert np.array_equal(_run(flattened(model, node, attribute), batch), _run(model, batch))


def test_each_branch_is_calibrated_on_the_batches_that_take_it(tmp_path):
    """Positive batches (small) take ``then``, negative ones (five times larger) ``else``: each branch's input range
    is the max of its own batches, to the bit; a branch no batch takes is calibrated on every batch."""
    model, cache = _branches(), Cache(tmp_path / "cache")
    small, large = _batches(1.0, 1.0, 3, 1), _batches(-1.0, 5.0, 3, 2)
    recipe = QDQ(INT8).configured({"calibration": "max"})
    measure = lambda graph, names, batches: calibrate(cache, graph, names, batches, Calibrator("max"))  # noqa: E731
    ranges = branch_ranges(model, recipe.calibration_recipe().tensors_to_calibrate, small + large, measure, held_values)
    assert set(ranges) == {"by_sign/then_branch/x", "by_sign/else_branch/x"}
    assert ranges["by_sign/then_branch/x"] == calibrate(cache, model.SerializeToString(), ["x"], small,
                                                        Calibrator("max"))["x"]
    assert ranges["by_sign/else_branch/x"] == calibrate(cache, model.SerializeToString(), ["x"], large,
                                                        Calibrator("max"))["x"]
    assert ranges["by_sign/then_branch/x"] < ranges["by_sign/else_branch/x"] / 2
    only_then = branch_ranges(model, recipe.calibration_recipe().tensors_to_calibrate, small, measure, held_values)
    assert only_then["by_sign/else_branch/x"] == only_then["by_sign/then_branch/x"]  # untaken: every batch


@pytest.mark.int8
def test_a_network_whose_weights_live_in_an_ifs_branches_is_quantized_there_and_judged(tmp_path):
    """Every weight inside an ``If`` whose condition is data (before: failed at 0 of 2 layers, and ONNX Runtime's own
    ``quantize_static`` writes no Q/DQ there either): both branches quantized, searched and judged at 2 of 2."""
    path = tmp_path / "branches.onnx"
    onnx.save(_branches(), str(path))
    pipeline = Pipeline(tmp_path / "cache", manifest=_manifest(tmp_path, "branches", path,
                                                               "[{name: x, shape: [4, 8]}]", ["y"]))
    result = pipeline.run(Case("branches", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    coverage = result.metrics["coverage"]
    assert coverage["quantized"] == coverage["layers"] == 2, coverage
    built = onnx.load(str(pipeline.store.precision_onnx("branches", pipeline.recipes.recipe("branches", "int8",
                                                                                             "emulated"))))
    for _, attribute, body in branches(built):
        kinds = [node.op_type for node in body.node]
        assert kinds.count("QuantizeLinear") == 1 and kinds.count("DequantizeLinear") == 2, (attribute, kinds)


@pytest.mark.int8
def test_a_voice_detector_whose_rate_is_data_is_quantized_in_both_branches(tmp_path):
    """The sample rate a 0-d input, not fixed: the If stays, and both rates' layers (4 of 4) run in INT8, the 8 kHz
    branch reading the rate inside its body too."""
    from test_before_search import _by_rate

    path = tmp_path / "vad.onnx"
    onnx.save(_by_rate(), str(path))
    inputs = "[{name: x, shape: [4, 8]}, {name: sr, shape: [], dtype: int64, range: [8000, 16001]}]"
    pipeline = Pipeline(tmp_path / "cache", manifest=_manifest(tmp_path, "vad", path, inputs, ["y"]))
    result = pipeline.run(Case("vad", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    coverage = result.metrics["recipe"]["coverage"]
    assert (coverage["quantized"], coverage["layers"]) == (4, 4), coverage
    assert "If" in {node.op_type for node in onnx.load(str(pipeline.store.fp32_onnx("vad"))).graph.node}


ROUTER = """import torch
from torch import nn


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.loud = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        self.quiet = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        if bool(x.abs().mean() > 1.0):
            return self.loud(x)
        return self.quiet(x)


def net():
    return torch.jit.script(Router().eval())
"""


@pytest.mark.int8
def test_a_torchscript_branch_on_the_data_is_quantized_in_both_branches(tmp_path, monkeypatch, qv_pipeline):
    """torch's TorchScript exporter writes a Python ``if`` on the data as an ``If`` whose branches hold the Linear
    layers (and their weights as outer initializers): all four run in INT8, the branch each batch takes calibrated on
    it."""
    import warnings

    from user_repo import written

    written(tmp_path, monkeypatch, {"router.py": ROUTER, "models.yaml": textwrap.dedent("""\
        models:
          - name: router
            build: router:net
            build_files: []
            inputs: [{name: x, shape: [8, 32], range: [-3, 3]}]
            outputs: [logits]
            calibration: synthetic
        """)})
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=tmp_path / "models.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script's deprecation
        result = pipeline.run(Case("router", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    fp32 = onnx.load(str(pipeline.store.fp32_onnx("router")))
    assert [node.op_type for node in fp32.graph.node].count("If") == 1
    coverage = result.metrics["coverage"]
    assert coverage["quantized"] == coverage["layers"] == 4 and coverage["kinds"] == {"Gemm": [4, 4]}, coverage
