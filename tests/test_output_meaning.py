"""Verdicts by what an output means: no accuracy where the task is not a classification, scalar inputs declared as
0-d tensors."""
import textwrap

from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline

from user_repo import written

PITCH = textwrap.dedent("""\
    import numpy as np
    import torch
    from torch import nn

    from quantverdict.models.spec import LabeledData


    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv1d(1, 8, 9, padding=4), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                             nn.Linear(8, 1)).eval()


    def batches(seed):
        rng = np.random.default_rng(seed)
        return [{"audio": rng.normal(0, 1, (8, 1, 64)).astype(np.float32)} for _ in range(4)]


    def calibration():
        return batches(1)


    def evaluation():
        inputs = batches(2)
        with torch.no_grad():
            truth = np.concatenate([net()(torch.from_numpy(b["audio"])).numpy() for b in inputs])[:, 0]
        return LabeledData(inputs, truth)  # the pitch itself: argmax of one value per sample is always 0


    def error(reference, candidate, labels):
        return {"mean_abs_error": float(np.mean(np.abs(candidate["pitch"][:, 0] - labels)))}
    """)
PITCH_MANIFEST = textwrap.dedent("""\
    models:
      - name: pitch
        build: pitchnet:net
        build_files: []
        inputs: [{name: audio, shape: [8, 1, 64]}]
        outputs: [pitch]
        task: regression
        calibration: pitchnet:calibration
        eval: pitchnet:evaluation
        metric: pitchnet:error
    """)


def test_a_regression_models_labels_go_to_its_metric_and_no_accuracy_is_computed_or_gated(tmp_path, monkeypatch):
    """A pitch network's labels are pitches: argmax over its one output is 0 for every sample, so an 'accuracy' of
    argmax == labels would be 0 (and its drop gated); the labels reach the user's metric and nothing else."""
    written(tmp_path, monkeypatch, {"pitchnet.py": PITCH, "models.yaml": PITCH_MANIFEST})
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("pitch", "fp32", "onnxruntime"))
    assert result.status == "passed", result.message
    assert "task" not in result.metrics and "accuracy" not in str(result.metrics.get("comparison", ""))
    assert 0 <= result.metrics["task_metrics"]["mean_abs_error"] < 1e-3  # FP32 against the FP32 pitch: the labels
