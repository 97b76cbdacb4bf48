"""Samples FP32 does not decide at its input's resolution, found by running the real model."""
import numpy as np

from quantverdict.judge.decided import dithered
from quantverdict.models.spec import InputSpec
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline

TWO_CLASSES = """import numpy as np
import torch


def build():
    layer = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(2))  # scores are the inputs: the larger one is the class
    return layer


def evaluation():
    rng = np.random.default_rng(3)
    first = rng.uniform(-0.5, 0.5, 64).astype(np.float32)
    margin = np.where(np.arange(64) < 48, rng.choice([-0.2, 0.2], 64), 0.0).astype(np.float32)  # 16 ties
    x = np.stack([first, first + margin], axis=1).astype(np.float32)
    return [{"x": x[i:i + 16]} for i in range(0, 64, 16)]
"""


def test_dither_moves_declared_inputs_within_half_a_step():
    batch = {"x": np.zeros((64, 3), np.float32), "ids": np.arange(4)}
    [moved] = dithered([batch], [InputSpec("x", (64, 3), resolution=0.1), InputSpec("ids", (4,), "int64")], seed=0)
    assert np.abs(moved["x"]).max() <= 0.05 and np.abs(moved["x"]).max() > 0.04
    assert moved["ids"] is batch["ids"]


def test_ties_are_undecided_and_left_out_of_top1(tmp_path, monkeypatch):
    """Sixteen samples whose two scores are equal: half a step of input moves FP32's decision on them,
    never on the 48 whose margin is 0.2; the case counts top-1 agreement on the others and says so."""
    (tmp_path / "two_classes.py").write_text(TWO_CLASSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: two-classes\n    build: two_classes:build\n    build_files: []\n"
        "    inputs: [{name: x, shape: [16, 2], resolution: 0.01}]\n    outputs: [scores]\n"
        "    task: classification\n    calibration: synthetic\n    eval: two_classes:evaluation\n")
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    undecided = pipeline.store.undecided("two-classes")
    assert not undecided[:48].any() and undecided[48:].sum() >= 12
    result = pipeline.run(Case("two-classes", "fp16", "onnxruntime"))
    metrics = result.metrics["metrics"]["scores"]
    assert metrics["top1_undecided"] == undecided.sum() and metrics["top1_samples"] == 64 - undecided.sum()
    assert result.status == "passed", result.message
