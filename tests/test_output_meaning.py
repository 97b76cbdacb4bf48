"""Verdicts by what an output means: no accuracy where the task is not a classification, scalar inputs declared as
0-d tensors."""
import textwrap
from pathlib import Path

import numpy as np
import pytest

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

    given = VOICE.replace('(4, 16, 128)).astype(np.float32)}',
                          '(4, 16, 128)).astype(np.float32), "sr": np.int64(8000)}')
    written(tmp_path, monkeypatch, {"voicenet8k.py": given,
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


def _blobs(samples: int, seed: int) -> np.ndarray:
    """Saliency-like maps: one Gaussian blob per image, peaking between 0.9 and 1 (a region above 0.8 in each)."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(np.arange(32), np.arange(32), indexing="ij"), -1).astype(np.float64)
    centres, widths = rng.uniform(8, 24, (samples, 1, 1, 2)), rng.uniform(4, 8, (samples, 1, 1))
    peaks = rng.uniform(0.9, 1.0, (samples, 1, 1))
    return (peaks * np.exp(-np.sum((grid - centres) ** 2, -1) / (2 * widths ** 2)))[:, None].astype(np.float32)


def _int8_map_tolerance():
    from quantverdict.judge.tolerances import ToleranceTable

    return ToleranceTable.load().resolve("saliency", "int8", {}, "regression", "probabilities")


def test_a_map_whose_region_moves_under_a_perfect_cosine_fails_by_its_region():
    """Every value 10% lower: cosine is exactly 1 (a scale), the region an application cuts at 0.8 shrinks by half;
    the region's IoU on the elements FP32 decides fails the default INT8 bounds."""
    from quantverdict.judge.compare import compare

    reference = _blobs(16, 0)
    judged = compare({"map": reference}, {"map": reference * 0.9}, _int8_map_tolerance(), maps={"map": 0.8})
    metrics = judged.metrics["map"]
    assert metrics["cosine"] == pytest.approx(1.0) and metrics["region_samples"] == 16
    assert metrics["region_iou"] < 0.85 and not judged.passed
    assert {check.metric for check in judged.failures()} >= {"region_iou"}
    assert "the region above 0.8, on the elements FP32 decides, in 16 samples" in judged.explain()


def test_a_map_with_noise_its_cosine_bound_allows_keeps_its_regions_and_peaks():
    """INT8-like noise (cosine ≈ 0.999): decisions move only where FP32 sits within that noise of the threshold."""
    from quantverdict.judge.compare import compare

    reference = _blobs(16, 1)
    noisy = reference + np.random.default_rng(2).normal(0, 0.01, reference.shape).astype(np.float32)
    judged = compare({"map": reference}, {"map": noisy}, _int8_map_tolerance(), maps={"map": 0.8})
    metrics = judged.metrics["map"]
    assert judged.passed, judged.explain()
    assert metrics["region_iou"] > 0.95 and metrics["peak_agreement"] == 1.0 and metrics["region_iou_worst"] > 0.8


def test_one_moved_image_fails_the_worst_sample_bound_where_the_mean_holds():
    from quantverdict.judge.compare import compare

    reference = _blobs(16, 3)
    moved = reference.copy()
    moved[5] = np.roll(reference[5], 12, axis=-1)  # one image's region and peak elsewhere
    judged = compare({"map": reference}, {"map": moved}, _int8_map_tolerance(), maps={"map": 0.8})
    metrics = judged.metrics["map"]
    assert metrics["region_iou"] > 0.85 and metrics["region_iou_worst"] < 0.5
    assert metrics["region_iou_worst_sample"] == 5
    failed = {check.metric for check in judged.failures()}
    assert "region_iou_worst" in failed and "region_iou" not in failed and "peak_agreement" not in failed


IMAGE_CALIBRATION = """

def calibration():
    rng = np.random.default_rng(1)
    return [{"image": rng.uniform(0, 1, (4, 3, %(size)d, %(size)d)).astype(np.float32)} for _ in range(4)]
"""
SALIENCY = textwrap.dedent("""\
    import numpy as np
    import torch
    from torch import nn


    def net():
        torch.manual_seed(0)
        layers = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                               nn.Conv2d(16, 1, 3, padding=1), nn.Sigmoid()).eval()
        with torch.no_grad():
            layers[4].weight.mul_(40.0)  # a map that spans (0, 1), as a trained one does
        return layers

    """) + IMAGE_CALIBRATION % {"size": 24}


def _fp32_and_int8(tmp_path, monkeypatch, source: str, build: str, size: int, output: str, extra: str):
    """A user's image model (its module ``source``, its calibration :data:`IMAGE_CALIBRATION`) run in FP32 and INT8
    on ONNX Runtime: the FP32 case's metrics of ``output``, and the INT8 case's result."""
    module = build.partition(":")[0]
    written(tmp_path, monkeypatch, {f"{module}.py": source, "models.yaml": (
        f"models:\n  - name: {module}\n    build: {build}\n    build_files: []\n"
        f"    inputs: [{{name: image, shape: [4, 3, {size}, {size}], range: [0, 1]}}]\n    outputs: [{output}]\n"
        f"    {extra}\n    calibration: {module}:calibration\n")})
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    exact = pipeline.run(Case(module, "fp32", "onnxruntime")).metrics["metrics"][output]
    return exact, pipeline.run(Case(module, "int8", "onnxruntime"))


def test_a_sigmoid_map_is_judged_at_its_declared_threshold(tmp_path, monkeypatch):
    exact, int8 = _fp32_and_int8(tmp_path, monkeypatch, SALIENCY, "saliency:net", 24, "map",
                                 "thresholds: {map: 0.52}")
    assert exact["region_threshold"] == 0.52 and exact["region_iou"] == 1.0 and exact["peak_agreement"] == 1.0
    assert int8.metrics["metrics"]["map"]["region_samples"] > 0
    assert {"region_iou", "region_iou_worst", "peak_agreement"} <= {c["metric"] for c in int8.metrics["checks"]}


def _head(images: int, anchors: int, classes: int, seed: int) -> np.ndarray:
    """A YOLOv8-style raw head [images, 4 + classes, anchors]: boxes as centre and size in pixels, class scores after
    a sigmoid; a few anchors per image hold an object (score .6 to .95), the rest score under .003."""
    rng = np.random.default_rng(seed)
    head = np.empty((images, 4 + classes, anchors), np.float32)
    head[:, 0:2] = rng.uniform(40, 600, (images, 2, anchors))
    head[:, 2:4] = rng.uniform(4, 300, (images, 2, anchors))
    head[:, 4:] = rng.uniform(0, 0.003, (images, classes, anchors))
    for image in range(images):
        objects = rng.choice(anchors, 4, replace=False)
        head[image, 4 + rng.integers(0, classes, 4), objects] = rng.uniform(0.6, 0.95, 4)
        head[image, 2:4, objects] = rng.uniform(40, 120, (4, 2))  # (objects, w h): the fancy index comes first
    return head


def _int8_detection_tolerance():
    from quantverdict.judge.tolerances import ToleranceTable

    return ToleranceTable.load().resolve("detector", "int8", {}, "regression", "detections")


def test_a_detector_head_is_judged_by_its_detections_not_by_anchors_any_threshold_discards():
    """The discarded anchors' box sizes move by a third of the largest value (max_norm_err .3 on the whole head, over
    INT8's .25), the kept anchors' by a pixel: every image's detections are FP32's, and the raw bounds, taken on the
    kept anchors, pass."""
    from quantverdict.judge.compare import compare
    from quantverdict.models.spec import DetectionFormat

    reference = _head(8, 400, 6, 0)
    candidate = reference.copy()
    discarded = reference[:, 4:].max(axis=1) < 0.25
    candidate[:, 2:4] += 200.0 * discarded[:, None, :]
    candidate[:, :4] += np.random.default_rng(1).normal(0, 0.5, candidate[:, :4].shape).astype(np.float32)
    tolerance = _int8_detection_tolerance()
    raw = compare({"output0": reference}, {"output0": candidate}, tolerance)
    assert not raw.passed and raw.metrics["output0"]["max_norm_err"] > 0.25
    judged = compare({"output0": reference}, {"output0": candidate}, tolerance,
                     detections={"output0": DetectionFormat()})
    metrics = judged.metrics["output0"]
    assert judged.passed, judged.explain()
    assert metrics["detection_f1"] == 1.0 and metrics["detections_identical"] == 1.0
    assert metrics["detections_reference"] == 32 and metrics["samples"] == 32 and metrics["matched_iou"] > 0.95


def test_a_search_scores_a_detector_head_on_the_anchors_the_verdict_reads():
    """A recipe search's score of a detector head (its held-out samples' error energies, pooled) is the verdict's
    ``snr_db`` of that head, taken on the anchors FP32 keeps: box sizes moved on anchors no threshold keeps move
    neither, where the whole head's SNR falls by tens of dB and would rank the two candidates the other way round."""
    from quantverdict.judge.by_kind import ByKind
    from quantverdict.models.spec import DetectionFormat, InputSpec, ModelSpec
    from quantverdict.tune.rules import pooled_snr_db, sample_noise

    reference = _head(8, 400, 6, 0)
    discarded = reference[:, 4:].max(axis=1) < 0.25
    kept_moved = reference + np.random.default_rng(1).normal(0, 2.0, reference.shape).astype(np.float32) * ~discarded[
        :, None, :]  # every attribute of the kept anchors, by two pixels (and their scores by 2)
    background_moved = reference.copy()
    background_moved[:, 2:4] += 200.0 * discarded[:, None, :]
    background_moved[:, :4] += np.random.default_rng(2).normal(0, 0.5, reference[:, :4].shape).astype(np.float32)
    tolerance = _int8_detection_tolerance()
    spec = ModelSpec("detector", [InputSpec("image", (8, 3, 64, 64))], ["output0"], onnx_path=Path("detector.onnx"),
                     detections={"output0": DetectionFormat()})
    judging = ByKind(spec, {"output0": "detections"}, tolerance, {"output0": tolerance})
    scored = judging.scored("output0", reference)

    def score(candidate: np.ndarray, view=scored) -> float:
        return pooled_snr_db(view(reference), sample_noise(view(reference), view(candidate)))

    for candidate in (kept_moved, background_moved):
        verdict = judging.compare({"output0": reference}, {"output0": candidate}).metrics["output0"]["snr_db"]
        assert score(candidate) == pytest.approx(verdict, abs=1e-6)
    assert score(background_moved) > score(kept_moved)  # as the verdict ranks them
    whole = lambda values: values  # noqa: E731 — the whole head, as searches scored it
    assert score(background_moved, whole) < score(kept_moved, whole) - 10
    assert scored(reference[:3]).shape == (3, *scored(reference).shape[1:])  # a search's first folds' samples


def test_a_layer_alone_costs_a_detector_head_what_it_costs_the_anchors_fp32_keeps():
    """The errors a fallback ranking reads of each layer quantized alone (a few sums per sample, made in its
    workers) are taken on the anchors FP32 keeps where the head is declared: box sizes moved on anchors no threshold
    keeps cost nothing, as they cost the verdict nothing; the view travels to the workers pickled."""
    import pickle

    from quantverdict.judge.layer_errors import Errors, views_of
    from quantverdict.models.spec import DetectionFormat
    from quantverdict.tune.rules import sample_noise

    reference = _head(8, 400, 6, 0)
    discarded = reference[:, 4:].max(axis=1) < 0.25
    background_moved = reference.copy()
    background_moved[:, 2:4] += 200.0 * discarded[:, None, :]
    kept_moved = reference + 2.0 * ~discarded[:, None, :]
    views = pickle.loads(pickle.dumps(views_of({"output0": DetectionFormat()}, {"output0": reference})))
    assert not Errors.of({"output0": reference}, {"output0": background_moved}, views).noise("output0").any()
    assert Errors.of({"output0": reference}, {"output0": background_moved}).noise("output0").all()  # the whole head
    noise = Errors.of({"output0": reference}, {"output0": kept_moved}, views).noise("output0")
    view = views["output0"]
    assert noise.all() and np.allclose(noise, sample_noise(view(reference), view(kept_moved)))


def test_a_moved_box_and_a_lost_detection_lower_the_images_f1():
    from quantverdict.judge.compare import compare
    from quantverdict.judge.detections import decode
    from quantverdict.models.spec import DetectionFormat

    layout = DetectionFormat()
    reference = _head(8, 400, 6, 2)
    candidate = reference.copy()
    kept = decode(reference[3], layout, layout.score).anchors
    candidate[3, 0, kept[0]] += 500.0  # one box of image 3 elsewhere: a miss and a false detection
    candidate[5, 4:, decode(reference[5], layout, layout.score).anchors] = 0.01  # image 5 loses every detection
    judged = compare({"output0": reference}, {"output0": candidate}, _int8_detection_tolerance(),
                     detections={"output0": layout})
    metrics = judged.metrics["output0"]
    assert metrics["detection_f1_worst"] == 0.0 and metrics["detection_f1_worst_image"] == 5
    assert metrics["detection_f1"] == pytest.approx((6 + 0.75 + 0.0) / 8)
    assert metrics["detections_identical"] == pytest.approx(6 / 8)
    assert "detection_f1" in {check.metric for check in judged.failures()}


def test_yolov5s_layout_with_objectness_and_anchors_first_is_read():
    """[images, anchors, 5 + classes] (box, objectness, classes): the shorter axis holds the attributes, and a
    detection's score is objectness × class score."""
    from quantverdict.judge.detections import decode
    from quantverdict.models.spec import DetectionFormat

    head = np.zeros((1, 50, 8), np.float32)
    head[0, :, 2:4] = 10.0
    head[0, 7, :4] = [100, 100, 40, 40]
    head[0, 7, 4], head[0, 7, 5 + 2] = 0.9, 0.8  # 0.72
    head[0, 9, :4] = [102, 101, 40, 40]
    head[0, 9, 4], head[0, 9, 5 + 2] = 0.5, 0.6  # 0.30, overlapping the first: suppressed
    head[0, 20, 4], head[0, 20, 5] = 0.9, 0.2  # 0.18: under the threshold
    found = decode(head[0], DetectionFormat(objectness=True), 0.25)
    assert found.anchors.tolist() == [7] and found.classes.tolist() == [2]
    assert found.scores[0] == pytest.approx(0.72) and found.boxes[0].tolist() == [80, 80, 120, 120]


DETECTOR = textwrap.dedent("""\
    import numpy as np
    import torch
    from torch import nn


    class Head(nn.Module):
        \"\"\"A one-stage head as YOLOv8 exports it: [batch, 4 + classes, anchors], boxes in pixels, class scores.\"\"\"

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU())
            self.box, self.cls = nn.Conv2d(32, 4, 1), nn.Conv2d(32, 3, 1)
            with torch.no_grad():
                self.cls.weight.mul_(100.0)
                self.cls.bias.fill_(-3.0)

        def forward(self, image):
            features = self.body(image)
            boxes = torch.sigmoid(self.box(features)) * 640.0
            scores = torch.sigmoid(self.cls(features))
            return torch.cat([boxes, scores], 1).flatten(2)

    """) + IMAGE_CALIBRATION % {"size": 32}


def test_a_declared_detector_head_is_judged_by_detections_in_a_run(tmp_path, monkeypatch):
    exact, int8 = _fp32_and_int8(tmp_path, monkeypatch, DETECTOR, "headnet:Head", 32, "output0",
                                 "detections: {output0: {score: 0.5}}")
    assert exact["detection_f1"] == 1.0 and exact["detection_score_threshold"] == 0.5
    assert exact["detections_reference"] > 0 and exact["samples"] == exact["detections_reference"]
    assert "detection_f1" in {check["metric"] for check in int8.metrics["checks"]}, int8.message


def test_compare_recipes_judges_a_detector_head_by_its_detections(tmp_path, monkeypatch, capsys):
    """Each quantizer's graph judged as the case's verdict judges it: the head by its detections (F1, raw metrics on
    the anchors FP32 keeps), in the table's "by kind" column and the JSON."""
    import json

    from quantverdict.run.cli import main

    _fp32_and_int8(tmp_path, monkeypatch, DETECTOR, "headnet:Head", 32, "output0",
                   "detections: {output0: {score: 0.5}}")
    assert main(["compare-recipes", "headnet", "--manifest", str(tmp_path / "models.yaml"), "--cache-dir",
                 str(tmp_path / "cache"), "--json", str(tmp_path / "compared.json")]) == 0
    rows = {row["label"]: row for row in json.loads((tmp_path / "compared.json").read_text())["quantizers"]}
    assert {"harness", "onnxruntime"} <= set(rows)
    for row in rows.values():
        assert 0 <= row["metrics"]["detection_f1"] <= 1 and row["metrics"]["samples"] == row["metrics"][
            "detections_reference"]
    assert "by kind" in capsys.readouterr().out


def _ctc(samples: int, positions: int, symbols: int, seed: int) -> np.ndarray:
    """A recogniser's CTC output [samples, positions, symbols]: each position a confident symbol (0 is the blank),
    symbols held over runs of positions, as a line of text is read."""
    rng = np.random.default_rng(seed)
    best = np.repeat(rng.integers(0, symbols, (samples, positions // 4)), 4, axis=1)
    logits = rng.normal(0, 1, (samples, positions, symbols)) + 8 * np.eye(symbols)[best]
    return (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)


def test_a_sequence_output_is_judged_by_what_it_decodes_to():
    """A flip inside a run of one symbol leaves the text as it was: per-position top-1 counts it, the decoded
    agreement does not; a changed symbol changes the text of that sample only."""
    from quantverdict.judge.compare import compare
    from quantverdict.judge.sequences import decode, edit_distance
    from quantverdict.judge.tolerances import ToleranceTable
    from quantverdict.models.spec import SequenceFormat

    assert decode(np.eye(4)[[0, 2, 2, 0, 2, 3, 3, 0]], blank=0) == [2, 2, 3]
    assert edit_distance([1, 2, 3], [1, 3]) == 1 and edit_distance([], [4, 4]) == 2
    reference = _ctc(20, 32, 30, 0)
    within_run = reference.copy()
    best = reference.argmax(-1)
    flipped = [sample for sample in range(20) if best[sample, 3] != best[sample, 4] and best[sample, 3] != 0][:8]
    within_run[flipped, 3] = np.eye(30)[0]  # a run's last position read as the blank: the same text, a top-1 flip
    layout = {"text": SequenceFormat()}
    tolerance = ToleranceTable.load().resolve("ocr", "int8", {}, "regression", "distribution")
    same = compare({"text": reference}, {"text": within_run}, tolerance, positionwise=frozenset({"text"}),
                   sequences=layout)
    assert len(flipped) >= 4 and same.metrics["text"]["top1_agreement"] == pytest.approx(1 - len(flipped) / 640)
    assert same.metrics["text"]["sequence_agreement"] == 1.0 and same.metrics["text"]["symbol_error_rate"] == 0.0
    changed = reference.copy()
    winner = changed[7, 8:12].argmax(-1)[0]
    changed[7, 8:12, winner], changed[7, 8:12, (winner + 1) % 30] = 0.0, 1.0  # one symbol of sample 7 replaced
    judged = compare({"text": reference}, {"text": changed}, tolerance, positionwise=frozenset({"text"}),
                     sequences=layout)
    metrics = judged.metrics["text"]
    assert metrics["sequence_agreement"] == pytest.approx(19 / 20) and metrics["sequence_worst_sample"] == 7
    assert metrics["sequence_worst_edits"] == 1 and judged.passed, judged.explain()


def test_a_manifest_declares_a_sequence_output_and_its_blank(tmp_path):
    from quantverdict.models.spec import SequenceFormat
    from quantverdict.run.manifest import load_manifest

    (tmp_path / "models.yaml").write_text("models:\n  - name: ocr\n    onnx: ocr.onnx\n    inputs: [{name: x, shape: "
                                          "[2, 32, 100]}]\n    outputs: [text]\n    calibration: synthetic\n"
                                          "    sequences: {text: {blank: 5, batch_axis: 1}}\n")
    spec = load_manifest(tmp_path / "models.yaml").specs[0]
    assert spec.sequences == {"text": SequenceFormat(blank=5, batch_axis=1)} and spec.output_kinds == {
        "text": "distribution"}


ENERGY = textwrap.dedent("""\
    import torch
    from torch import nn


    class Scored(nn.Module):
        '''A classifier that also returns its batch's mean free energy: one value for the whole batch (a 0-d output).'''

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 5)

        def forward(self, x):
            logits = self.fc(self.conv(x).mean((2, 3)))
            return logits, -logits.logsumexp(-1).mean()


    def net():
        return Scored().eval()
    """)


@pytest.mark.int8
def test_a_classifiers_scalar_output_beside_its_scores_is_judged_by_its_values(tmp_path, monkeypatch):
    """A 0-d output is one value a batch (they could not be joined before: "zero-dimensional arrays cannot be
    concatenated"); beside a classifier's scores, its first output, it is judged by its values, and top-1 on the
    scores alone."""
    written(tmp_path, monkeypatch, {"scored.py": ENERGY, "models.yaml": textwrap.dedent("""\
        models:
          - name: scored
            build: scored:net
            build_files: []
            inputs: [{name: x, shape: [4, 3, 16, 16], range: [0, 1]}]
            outputs: [logits, energy]
            task: classification
            calibration: synthetic
            recipe: {int8: {calibration: max}}
        """)})
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    result = pipeline.run(Case("scored", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    batches = len(pipeline.store.eval_batches("scored"))
    for verdict in (result.metrics["metrics"], result.metrics["recipe"]["metrics"]):
        assert verdict["energy"]["samples"] == batches and "top1_agreement" not in verdict["energy"]
        assert verdict["logits"]["top1_samples"] == 4 * batches


def test_a_head_on_grids_is_decoded_to_the_boxes_its_offsets_place():
    """YOLOX exported without its decoding: each anchor holds offsets on its cell of one of the grids (strides 8, 16,
    32 over 96 × 64 pixels, each level's cells row by row); a box placed by its offsets is read where it was put, in
    pixels, and a head of another anchor count is one line naming both counts."""
    from quantverdict.judge.detections import decode
    from quantverdict.models.spec import DetectionFormat

    layout = DetectionFormat(objectness=True, grid=(8, 16, 32), image=(96, 64))
    cells = [(x, y, stride) for stride in (8, 16, 32) for y in range(96 // stride) for x in range(64 // stride)]
    head = np.zeros((len(cells), 6))  # x y w h, objectness, one class
    placed = {}
    for anchor, (cx, cy, w, h) in {5: (44.0, 12.0, 10.0, 6.0), 100: (20.0, 70.0, 24.0, 30.0),
                                   len(cells) - 1: (50.0, 90.0, 64.0, 40.0)}.items():
        x, y, stride = cells[anchor]
        head[anchor] = [cx / stride - x, cy / stride - y, np.log(w / stride), np.log(h / stride), 0.9, 0.9]
        placed[anchor] = [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]
    found = decode(head, layout, 0.5)
    assert sorted(found.anchors.tolist()) == sorted(placed)
    for anchor, box in zip(found.anchors, found.boxes):
        np.testing.assert_allclose(box, placed[int(anchor)], atol=1e-9)
    assert len(cells) == 96 * 64 // 64 + 96 * 64 // 256 + 6  # 96 + 24 + 6: the last level's 3 × 2 cells
    with pytest.raises(ValueError, match=r"strides \[8, 16, 32\] over a 96 × 64 image has 126 anchors; this one has "
                                         "125"):
        decode(head[:-1], layout, 0.5)


def test_a_manifest_declares_a_head_on_grids_and_the_image_is_its_first_inputs(tmp_path):
    from quantverdict.models.spec import DetectionFormat
    from quantverdict.run.manifest import load_manifest

    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: det\n    onnx: det.onnx\n    inputs: [{name: images, shape: [1, 3, 416, 320]}]\n"
        "    outputs: [output]\n    calibration: synthetic\n"
        "    detections: {output: {objectness: true, grid: [8, 16, 32], score: 0.1}}\n")
    spec = load_manifest(tmp_path / "models.yaml").specs[0]
    assert spec.detections == {"output": DetectionFormat(objectness=True, score=0.1, grid=(8, 16, 32),
                                                         image=(416, 320))}
