"""Calibrators, the calibration cache, TensorRT's cache format, FP8 scales and sensitivity (fallback: test_fallback.py)."""
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from quantverdict.errors import CalibrationError
from quantverdict.run.pipeline import Pipeline
from quantverdict.precision import get_recipe
from quantverdict.precision import calibrate
from quantverdict.precision.calibrate import FORWARD_PASSES
from quantverdict.precision.calibrators import BINS, CHUNK, METHODS, Calibrator, Histogram
from quantverdict.judge.semantics import evaluate_semantics
from quantverdict.judge.sensitivity import evaluate_recipe, fallback_until_within, layer_sensitivity
from quantverdict.precision.trt_cache import from_trt_cache, to_trt_cache
from quantverdict.judge.tolerances import Tolerance


def gaussian_with_outliers(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(8):
        x = rng.normal(size=50_000).astype(np.float32)
        x[:2] *= 40
        batches.append(x)
    return batches


def test_streaming_histogram_matches_the_whole_data():
    batches = gaussian_with_outliers()
    hist = Histogram()
    for batch in sorted(batches, key=lambda b: np.abs(b).max()):  # range grows batch after batch
        hist.add(batch)
    everything = np.abs(np.concatenate(batches))
    assert hist.max == everything.max() and hist.counts.sum() == everything.size
    bin_width = hist.limit / len(hist.counts)
    assert abs(Calibrator("percentile", percentile=99.9).amax(hist) - np.percentile(everything, 99.9)) <= 2 * bin_width


@pytest.mark.parametrize("size", [1, CHUNK - 1, CHUNK, 3 * CHUNK + 7])
def test_bins_counted_in_chunks_are_the_whole_arrays_rule(size):
    """|x| binned a chunk at a time in buffers kept for the call counts each value where the whole array's rule puts
    it: the float32 product's integer part, the top edge in the last bin, a subnormal range by float64 (whose factor
    would overflow float32); negative values and -0.0 by their magnitude."""
    from quantverdict.precision.calibrators import _counts

    rng = np.random.default_rng(size)
    values = (rng.standard_normal(size) * 3).astype(np.float32)
    values[-1] = -0.0 if size > 1 else values[-1]
    for limit in (float(np.abs(values).max()), 1e-40):
        scaled = values * np.float32(1e-41) if limit == 1e-40 else values
        factor = BINS / limit
        rule = (np.abs(scaled).astype(np.float64) * factor if factor >= float(np.finfo(np.float32).max)
                else np.abs(scaled) * np.float32(factor)).astype(np.intp)
        expected = np.bincount(np.minimum(rule, BINS - 1), minlength=BINS)
        assert np.array_equal(_counts(scaled, BINS, limit), expected)


def test_methods_clip_outliers_and_max_does_not():
    hist = Histogram()
    for batch in gaussian_with_outliers():
        hist.add(batch)
    amax = {method: Calibrator(method).amax(hist) for method in METHODS}
    assert amax["max"] == hist.max > 60
    assert 3.0 < amax["entropy"] < 8.0  # KL keeps the bulk of a unit Gaussian, drops 40σ outliers
    assert 3.0 < amax["percentile"] < 5.0  # 99.99th percentile of |N(0,1)| ≈ 3.9
    assert amax["mse"] < amax["max"]


def test_unknown_method_is_named():
    with pytest.raises(CalibrationError, match="unknown calibration method 'kl'; known: max, entropy, percentile, mse"):
        Calibrator("kl")


@pytest.mark.int8
@pytest.mark.parametrize("method", list(METHODS))
def test_digits_int8_accuracy_per_calibrator(method, qv_pipeline):
    """Judged on the graph's semantics: the same verdict on every CPU."""
    recipe = get_recipe("int8").with_options(calibrator=Calibrator(method))
    tolerance = qv_pipeline.tolerances.resolve("digits-cnn", "int8", {})
    result = evaluate_recipe(qv_pipeline.store, "digits-cnn", recipe, tolerance)
    labels = qv_pipeline.models.get("digits-cnn").eval_data().labels
    semantics = evaluate_semantics(qv_pipeline.store.precision_onnx("digits-cnn", recipe),
                                   qv_pipeline.store.eval_batches("digits-cnn"))["logits"]
    reference = qv_pipeline.store.reference("digits-cnn")["logits"]
    drop = 100 * (np.mean(reference.argmax(1) == labels) - np.mean(semantics.argmax(1) == labels))
    assert drop <= tolerance.max_accuracy_drop, f"{method}: INT8 loses {drop:.2f} points of digits accuracy"
    assert result.passed, result.explain()


@pytest.mark.int8
@pytest.mark.parametrize("method", list(METHODS))
def test_resnet18_int8_within_tolerance_per_calibrator(method, qv_pipeline):
    """On the graph's semantics (CPU-independent), under the tolerance table's bounds."""
    recipe = get_recipe("int8").with_options(calibrator=Calibrator(method))
    result = evaluate_recipe(qv_pipeline.store, "resnet18", recipe,
                             qv_pipeline.tolerances.resolve("resnet18", "int8", {}))
    assert result.passed, result.explain()


def _pipeline_with_fresh_cache(tmp_path: Path, manifest: Path | None = None) -> Pipeline:
    return Pipeline(tmp_path / "cache", manifest=manifest)


@pytest.mark.int8
def test_cache_hit_runs_no_forward_pass_and_gives_identical_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate, "_HISTOGRAMS", {})  # nothing collected earlier in this process
    pipeline = _pipeline_with_fresh_cache(tmp_path)
    recipe = get_recipe("int8")
    graph_name = onnx.load(str(pipeline.store.fp32_onnx("cnn"))).graph.name
    before = FORWARD_PASSES[graph_name]
    first = pipeline.store.precision_onnx("cnn", recipe).read_bytes()
    assert FORWARD_PASSES[graph_name] - before == 4  # one pass per calibration batch
    second_pipeline = _pipeline_with_fresh_cache(tmp_path)  # a new session, same cache
    middle = FORWARD_PASSES[graph_name]
    second = second_pipeline.store.precision_onnx("cnn", recipe).read_bytes()
    assert second == first
    assert second_pipeline.cache.stats["precision.hit"] == 1  # the graph is found without its ranges
    assert second_pipeline.store.ranges("cnn", recipe)  # the ranges (TensorRT's implicit INT8) are cached too
    assert FORWARD_PASSES[graph_name] == middle
    assert second_pipeline.cache.stats["calibration.hit"] == 1 and not second_pipeline.cache.stats["calibration.miss"]


@pytest.mark.int8
def test_changed_method_sample_or_weight_recalibrates(tmp_path):
    pipeline = _pipeline_with_fresh_cache(tmp_path)
    pipeline.store.precision_onnx("mlp", get_recipe("int8"))
    misses = lambda: pipeline.cache.stats["calibration.miss"]  # noqa: E731
    assert misses() == 1
    pipeline.store.precision_onnx("mlp", get_recipe("int8").with_options(calibrator=Calibrator("percentile")))
    assert misses() == 2
    original = pipeline.store.calibration_batches
    def one_sample_changed(model):  # noqa: E306
        batches = original(model)
        batches[0] = {k: v.copy() for k, v in batches[0].items()}
        batches[0]["input"][0, 0] += 0.5
        return batches
    resampled = _pipeline_with_fresh_cache(tmp_path)  # a new process's store, same cache
    resampled.store.calibration_batches = one_sample_changed
    resampled.store.precision_onnx("mlp", get_recipe("int8"))
    assert resampled.cache.stats["calibration.miss"] == 1


@pytest.mark.int8
def test_a_changed_build_file_recalibrates_and_an_unchanged_one_builds_nothing(tmp_path):
    """A manifest model declares the file its build reads: the warm run finds its export, ranges and
    precision graph without building it; a changed file is a new model, exported and calibrated anew."""
    (tmp_path / "scaled_by_file.py").write_text(
        "from pathlib import Path\nimport torch\n\n\ndef build():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))\n"
        "    with torch.no_grad():\n"
        "        model[0].weight.mul_(float(Path(__file__).with_name('scale.txt').read_text()))\n"
        "    return model\n")
    (tmp_path / "scale.txt").write_text("1.0")
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: scaled\n    build: scaled_by_file:build\n    build_files: [scale.txt]\n"
        "    inputs: [{name: x, shape: [4, 8]}]\n    outputs: [y]\n    calibration: synthetic\n")

    def pipeline() -> Pipeline:
        return Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")

    first = pipeline()
    first_graph = first.store.precision_onnx("scaled", get_recipe("int8"))
    warm = pipeline()
    assert warm.store.precision_onnx("scaled", get_recipe("int8")) == first_graph
    assert not warm.store.shared.modules.items and not warm.cache.stats["calibration.miss"]
    (tmp_path / "scale.txt").write_text("3.0")
    changed = pipeline()
    assert changed.store.precision_onnx("scaled", get_recipe("int8")) != first_graph
    assert changed.cache.stats["onnx.miss"] == 1 and changed.cache.stats["calibration.miss"] == 1


@pytest.mark.int8
def test_corrupt_calibration_cache_is_detected_and_rebuilt(tmp_path):
    pipeline = _pipeline_with_fresh_cache(tmp_path)
    first = pipeline.store.ranges("cnn", get_recipe("int8"))
    [entry] = (tmp_path / "cache" / "calibration").rglob("*.json.json")
    data = entry.with_name(entry.name[: -len(".json")])
    data.write_text(data.read_text()[:40])  # truncated mid-file
    fresh = _pipeline_with_fresh_cache(tmp_path)
    with pytest.warns(UserWarning, match="does not match its checksum"):
        rebuilt = fresh.store.ranges("cnn", get_recipe("int8"))
    assert rebuilt == first
    assert fresh.cache.stats["calibration.corrupt"] == 1 and data.with_name(data.name + ".corrupt").exists()


def test_trt_cache_round_trip_and_format(qv_pipeline):
    ranges = {"input": 2.0, "/conv1/Relu_output_0": 0.123456, "x:with:colons": 1e-6}
    text = to_trt_cache(ranges)
    lines = text.splitlines()
    assert re.fullmatch(r"TRT-\d+-EntropyCalibration2", lines[0])
    assert all(re.fullmatch(r".+: [0-9a-f]{8}", line) for line in lines[1:])
    assert lines[1] == "input: " + np.array([2.0 / 127], dtype=">f4").tobytes().hex()  # big-endian float32 bits
    back = from_trt_cache(text)
    assert back.keys() == ranges.keys()
    assert all(np.float32(back[k] / 127) == np.float32(ranges[k] / 127) for k in ranges)
    with pytest.raises(CalibrationError, match=r"line 3 'broken line'"):
        from_trt_cache(lines[0] + "\ninput: 3c010204\nbroken line\n")


@pytest.mark.fp8
def test_fp8_e4m3_error_matches_its_3_bit_mantissa():
    from quantverdict.precision.grids import FP8_E4M3

    rng = np.random.default_rng(3)
    x = rng.uniform(2 ** -6, 448, size=100_000).astype(np.float32)  # the normal range of E4M3
    rounded = FP8_E4M3.quantize(x).astype(np.float32)
    relative = np.abs(rounded - x) / x
    assert relative.max() <= 2 ** -4 + 1e-7  # half a unit in the last place of a 3-bit mantissa
    assert relative.max() > 2 ** -5  # and really that coarse (not silently higher precision)


@pytest.mark.fp8
def test_own_fp8_scales_beat_onnxruntime_fp8_quantization(qv_pipeline, tmp_path, ort_quantize_static):
    import onnxruntime
    from onnxruntime.quantization import CalibrationMethod, QuantType

    theirs = tmp_path / "cnn-fp8-ort.onnx"
    ort_quantize_static(qv_pipeline.store.fp32_onnx("cnn"), theirs, qv_pipeline.store.calibration_batches("cnn"),
                        activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN,
                        calibrate_method=CalibrationMethod.Distribution)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(theirs), options, providers=["CPUExecutionProvider"])
    reference = qv_pipeline.store.reference("cnn")["logits"]
    their_out = np.concatenate([session.run(None, b)[0] for b in qv_pipeline.store.eval_batches("cnn")])
    ours = evaluate_recipe(qv_pipeline.store, "cnn", get_recipe("fp8"), Tolerance()).metrics["logits"]
    their_err = float(np.abs(their_out - reference).max())
    assert ours["max_abs_err"] * 3 < their_err, (ours["max_abs_err"], their_err)


@pytest.mark.int8
def test_sensitivity_ranks_layers_and_fallback_meets_a_tight_bound(qv_pipeline):
    recipe = get_recipe("int8")
    rows = layer_sensitivity(qv_pipeline.store, "resblock", recipe)
    graph = onnx.load(str(qv_pipeline.store.fp32_onnx("resblock")))
    weighted = [n.name for n in recipe.quantized_nodes(graph) if n.op_type in ("Conv", "Gemm", "MatMul")]
    assert sorted(r.layer for r in rows) == sorted(weighted)
    assert [r.snr_db for r in rows] == sorted(r.snr_db for r in rows)
    full = evaluate_recipe(qv_pipeline.store, "resblock", recipe, Tolerance()).metrics["logits"]["cosine"]
    bound = 1 - (1 - full) / 4  # four times closer to FP32 than the fully quantized model
    chosen, kept, result = fallback_until_within(qv_pipeline.store, "resblock", recipe, Tolerance(min_cosine=bound))
    assert result.passed and kept and kept[0] == rows[0].layer
    assert chosen.options.fallback_layers == tuple(kept)
    assert len(recipe.quantized_nodes(graph)) - len(chosen.quantized_nodes(graph)) == len(kept)


def test_fp8_mse_weighs_e4m3_rounding_not_int8_steps():
    """On heavy-tailed values the int8-grid MSE threshold clips the tail (uniform steps cost every value
    step²/12), while E4M3's relative rounding makes clipping cost more than it saves: the FP8 threshold
    keeps the maximum. An FP8 recipe's mse calibrator is the E4M3 one, and says so in its key."""
    from quantverdict.precision.grids import FP8_E4M3, INT8
    from quantverdict.precision.qdq import QDQ, QDQOptions

    histogram = Histogram()
    histogram.add(np.random.default_rng(0).standard_t(3, 100_000))
    int8_threshold = Calibrator("mse").amax(histogram)
    fp8_threshold = Calibrator("mse", grid="e4m3").amax(histogram)
    assert int8_threshold < 0.8 * histogram.max and fp8_threshold == pytest.approx(histogram.max, rel=0.02)
    options = QDQOptions(calibrator=Calibrator("mse"))
    assert QDQ(FP8_E4M3, options).calibrator.params == {"method": "mse", "grid": "e4m3"}
    assert QDQ(INT8, options).calibrator.params == {"method": "mse"}


def test_calibrators_share_one_pass_over_a_graph_and_give_what_each_collects_alone(tmp_path, monkeypatch):
    """max, percentile and MSE on one graph and batch set read one set of histograms (a search tries all three on every
    fold): one forward pass per batch in all, and each method's ranges those of its own pass."""
    from quantverdict.cache import Cache

    pipeline = _pipeline_with_fresh_cache(tmp_path)
    model_bytes = pipeline.store.fp32_onnx("cnn").read_bytes()
    model = onnx.load_from_string(model_bytes)
    tensors = get_recipe("int8").tensors_to_calibrate(model)
    batches = pipeline.store.calibration_batches("cnn")
    methods = [Calibrator("max"), Calibrator("percentile"), Calibrator("mse")]
    monkeypatch.setattr(calibrate, "_HISTOGRAMS", {})
    before = FORWARD_PASSES[model.graph.name]
    shared = [calibrate.calibrate(Cache(tmp_path / "shared"), model_bytes, tensors, batches, m) for m in methods]
    assert FORWARD_PASSES[model.graph.name] - before == len(batches)
    alone = []
    for method in methods:
        monkeypatch.setattr(calibrate, "_HISTOGRAMS", {})
        alone.append(calibrate.calibrate(Cache(tmp_path / f"alone-{method.method}"), model_bytes, tensors, batches,
                                         method))
    assert shared == alone and shared[0] != shared[1]


def test_a_histogram_of_overflowed_activations_bins_the_finite_ones_and_keeps_the_infinite_max():
    """Every calibrator reads the same histograms, so one with an infinite activation must still bin the rest
    (numpy refuses an infinite range): its max stays infinite, which names the overflow downstream."""
    hist = Histogram()
    hist.add(np.array([1.0, -3.0, np.inf, np.nan], np.float32))
    hist.add(np.array([np.inf], np.float32))
    assert hist.max == np.inf and hist.limit == 3.0 and hist.counts.sum() == 2
    assert Calibrator("percentile", percentile=50).amax(hist) <= 3.0
