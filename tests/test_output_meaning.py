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


VOICE = textwrap.dedent("""\
    import numpy as np
    import torch
    from torch import nn


    class Detector(nn.Module):
        \"\"\"A voice detector that reads its sample rate as a 0-d int64 tensor (as Silero-style networks do).\"\"\"

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = nn.Conv1d(16, 32, 9, stride=4)
            self.head = nn.Linear(32, 1)

        def forward(self, audio, sr):
            features = torch.relu(self.conv(audio)).mean(-1)
            return torch.sigmoid(self.head(features) * (sr.float() / 16000.0))


    def net():
        return Detector().eval()


    def calibration():
        rng = np.random.default_rng(1)
        return [{"audio": rng.normal(0, 0.3, (4, 16, 128)).astype(np.float32)} for _ in range(3)]
    """)
VOICE_MANIFEST = textwrap.dedent("""\
    models:
      - name: voice
        build: voicenet:net
        build_files: []
        inputs:
          - {name: audio, shape: [4, 16, 128]}
          - {name: sr, shape: [], dtype: int64, value: 16000}
        outputs: [speech]
        calibration: voicenet:calibration
    """)


def test_a_scalar_input_is_declared_with_no_shape_and_fed_as_a_0_d_tensor(tmp_path, monkeypatch):
    """``shape: []`` with a fixed ``value``: the calibration batches leave it out and get it filled in; the graph's
    input is 0-d and every batch feeds it so (a rank-1 workaround works only where ONNX Runtime is lenient)."""
    import onnx

    written(tmp_path, monkeypatch, {"voicenet.py": VOICE, "models.yaml": VOICE_MANIFEST})
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    batches = pipeline.store.calibration_batches("voice")
    assert [b["sr"].shape for b in batches] == [()] * 3 and batches[0]["sr"].dtype == "int64"
    graph = onnx.load(pipeline.store.fp32_onnx("voice"))
    sr = next(i for i in graph.graph.input if i.name == "sr")
    assert len(sr.type.tensor_type.shape.dim) == 0
    for precision in ("fp32", "int8"):
        result = pipeline.run(Case("voice", precision, "onnxruntime"))
        assert result.status in ("passed", "failed"), result.message  # judged, not refused
        assert result.metrics["metrics"]["speech"]["cosine"] > 0.9


def test_a_scalar_inputs_declared_value_is_checked_in_a_users_batches(tmp_path, monkeypatch):
    from quantverdict.errors import InputDataError

    written(tmp_path, monkeypatch, {"voicenet8k.py": VOICE.replace('(4, 16, 128)).astype(np.float32)}',
                                                                 '(4, 16, 128)).astype(np.float32), "sr": np.int64(8000)}'),
                                    "models.yaml": VOICE_MANIFEST.replace("voicenet:", "voicenet8k:")})
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    try:
        pipeline.store.calibration_batches("voice")
    except InputDataError as exc:
        assert "batch 0, input 'sr': values other than its declared value 16000" in str(exc)
    else:
        raise AssertionError("a value other than the declared one was accepted")


def test_a_dynamic_axis_beyond_an_inputs_rank_is_one_line(tmp_path):
    from quantverdict.documents import DocumentError
    from quantverdict.run.manifest import load_manifest

    (tmp_path / "models.yaml").write_text(VOICE_MANIFEST.replace("value: 16000}", "dynamic_axes: {0: batch}}"))
    try:
        load_manifest(tmp_path / "models.yaml")
    except DocumentError as exc:
        assert str(exc).count("\n") == 0 and "model 'voice'" in str(exc) and "axis 0 of a 0-d input" in str(exc)
    else:
        raise AssertionError("accepted")
