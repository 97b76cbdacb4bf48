"""The comparator's semantics, checked on constructed outputs."""
import numpy as np
import pytest

from quantverdict.errors import ResolutionWarning
from quantverdict.judge.compare import Check, Comparison, compare, task_accuracy
from quantverdict.judge.intervals import proportion_interval
from quantverdict.judge.tolerances import Tolerance, ToleranceTable


def test_element_fails_only_when_both_atol_and_rtol_are_exceeded():
    ref = np.array([[100.0, 0.0]], np.float32)
    # 100 → 100.5: abs 0.5 > atol but rel 0.005 ≤ rtol; 0 → 0.001: rel inf but abs ≤ atol.
    ok = compare({"y": ref}, {"y": np.array([[100.5, 0.001]], np.float32)}, Tolerance(atol=0.01, rtol=0.01))
    assert ok.passed
    bad = compare({"y": ref}, {"y": np.array([[102.0, 0.001]], np.float32)}, Tolerance(atol=0.01, rtol=0.01))
    assert not bad.passed
    assert "fraction within atol=0.01/rtol=0.01 = 0.5, must be ≥ 1" in bad.explain()


def test_cosine_is_computed_in_float64():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(64, 1000)).astype(np.float16)
    result = compare({"y": ref}, {"y": ref.copy()}, Tolerance(min_cosine=1.0))
    assert result.metrics["y"]["cosine"] == 1.0 and result.passed


def test_top1_and_accuracy_drop():
    ref = np.eye(4, dtype=np.float32)
    swapped = ref[[1, 0, 2, 3]]
    result = compare({"y": ref}, {"y": swapped}, Tolerance(min_top1=0.75), classification=True)
    assert result.metrics["y"]["top1_agreement"] == 0.5 and not result.passed
    reference_correct = np.arange(200) < 194  # 97.0%
    candidate_correct = np.arange(200) < 191  # 95.5%: three samples lost
    judged = Comparison()
    task = task_accuracy(reference_correct, candidate_correct, Tolerance(max_accuracy_drop=1.0), judged)
    [check] = judged.checks
    assert not check.passed and abs(check.observed - 1.5) < 1e-9 and judged.notes == []
    low, high = task["intervals"]["accuracy_drop_points"]["low"], task["intervals"]["accuracy_drop_points"]["high"]
    assert low < 1.5 < high and high - low < 5


def test_a_bound_finer_than_the_samples_is_widened_with_the_count_needed():
    correct = np.ones(128, bool)
    one_flip = correct.copy()
    one_flip[0] = False  # 0.78 points on 128 samples: finer than a 0.5-point bound can say
    judged = Comparison()
    with pytest.warns(ResolutionWarning, match="200 samples would resolve it"):
        task_accuracy(correct, one_flip, Tolerance(max_accuracy_drop=0.5), judged)
    assert judged.passed and judged.checks[0].bound == pytest.approx(100 / 128)
    two_flips = one_flip.copy()
    two_flips[1] = False
    judged = Comparison()
    with pytest.warns(ResolutionWarning):
        task_accuracy(correct, two_flips, Tolerance(max_accuracy_drop=0.5), judged)
    assert not judged.passed


def test_top1_bound_is_widened_on_few_samples_and_exact_bounds_are_kept():
    ref = np.eye(16, dtype=np.float32)
    one_off = ref.copy()
    one_off[0] = ref[1]
    with pytest.warns(ResolutionWarning, match="20 samples would resolve it"):
        widened = compare({"y": ref}, {"y": one_off}, Tolerance(min_top1=0.95), classification=True)
    assert widened.passed and widened.metrics["y"]["intervals"]["top1_agreement"]["low"] < 15 / 16
    exact = compare({"y": ref}, {"y": one_off}, Tolerance(min_top1=1.0), classification=True)
    assert not exact.passed and exact.notes == []


def test_intervals_cover_the_truth_at_their_confidence():
    """Exact intervals: over many simulated evaluation sets, the true rate is inside ≥ 95% of the time."""
    rng = np.random.default_rng(0)
    inside = [proportion_interval(int(rng.binomial(60, 0.9)), 60).low <= 0.9 <= proportion_interval(
        int(rng.binomial(60, 0.9)), 60).high for _ in range(400)]
    assert np.mean(inside) >= 0.93


def test_nan_output_never_passes():
    ref = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = ref.copy()
    out[0, 0] = np.nan
    assert not compare({"y": ref}, {"y": out}, Tolerance(min_cosine=0.0)).passed


def test_an_infinite_element_is_named_without_numpys_warnings_or_an_interval_that_leaves_it_out():
    """A feature extractor's log of an energy FP16 flushed to zero: one −∞ among 9600 values. Its cosine is NaN and
    its SNR −∞ (numpy warned of both into a user's pytest summary), and it has no interval: the resamples that miss
    that sample read a cosine of 1.0, an interval of [1, 1] beside a NaN."""
    import warnings

    ref = np.random.default_rng(0).normal(size=(8, 30, 40)).astype(np.float32)
    out = ref.copy()
    out[3, 2, 1] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = compare({"y": ref}, {"y": out}, ToleranceTable.load().resolve("m", "fp16", {}, "regression"))
    metrics = result.metrics["y"]
    assert np.isnan(metrics["cosine"]) and metrics["snr_db"] == -np.inf and metrics["intervals"] == {}
    assert metrics["nonfinite"] == 1 and not result.passed


def test_missing_output_and_shape_mismatch_fail():
    ref = {"a": np.arange(3, dtype=np.float32), "b": np.arange(3, dtype=np.float32)}
    result = compare(ref, {"a": np.ones(4, np.float32)}, Tolerance())
    assert [c.metric for c in result.failures()] == ["shape (4,) vs (3,)", "present"]


def test_table_overrides_in_order(tmp_path):
    """The packaged defaults, the user's file over them bound by bound (null removes one), the model
    spec's own bounds, then the file's per-model bounds."""
    packaged = ToleranceTable.load().resolve("other", "int8", {}).to_dict()
    table_file = tmp_path / "tol.yaml"
    table_file.write_text("defaults:\n  int8: {min_cosine: 0.99, min_top1: 0.9, atol: null}\n"
                          "models:\n  m: {int8: {min_top1: null, max_norm_err: 0.5}}\n")
    table = ToleranceTable.load(table_file)
    tol = table.resolve("m", "int8", {"int8": {"min_cosine": 0.95, "max_norm_err": 0.1}})
    expected = {**packaged, "min_cosine": 0.95, "max_norm_err": 0.5}
    del expected["min_top1"]  # null in the file's per-model bounds
    assert tol.to_dict() == expected
    assert table.resolve("other", "int8", {}).to_dict() == {**packaged, "min_cosine": 0.99, "min_top1": 0.9}


def test_a_misspelled_bound_in_a_tolerance_file_is_named_with_the_closest(tmp_path):
    from quantverdict.errors import HarnessError

    table_file = tmp_path / "tol.yaml"
    table_file.write_text("models:\n  m: {int8: {min_cosin: 0.9}}\n")
    with pytest.raises(HarnessError, match=r"tol\.yaml: models\.m\.int8\.min_cosin: unknown field 'min_cosin'; "
                                           r"did you mean 'min_cosine'\?"):
        ToleranceTable.load(table_file)


def test_top1_agreement_leaves_out_samples_fp32_does_not_decide():
    """Flips on undecided samples are not counted (both counts are kept); one on a decided sample is."""
    ref = np.eye(10, dtype=np.float32)
    candidate = ref[[1, 0, 2, 3, 4, 5, 6, 7, 8, 9]]  # samples 0 and 1 flipped
    undecided = np.zeros(10, bool)
    undecided[[0, 1]] = True
    judged = compare({"y": ref}, {"y": candidate}, Tolerance(min_top1=1.0), True, undecided)
    metrics = judged.metrics["y"]
    assert judged.passed and metrics["top1_agreement"] == 1.0 and metrics["top1_samples"] == 8
    assert metrics["top1_undecided"] == 2 and metrics["top1_agreement_all"] == 0.8
    undecided[1] = False
    judged = compare({"y": ref}, {"y": candidate}, Tolerance(min_top1=1.0), True, undecided)
    assert not judged.passed and judged.metrics["y"]["top1_agreement"] == pytest.approx(8 / 9)
    assert "over the 9 samples FP32 decides at its inputs' resolution (1 undecided left out; over all: 0.8)" \
        in judged.explain()
    plain = compare({"y": ref}, {"y": candidate}, Tolerance(), True).metrics["y"]
    assert plain["top1_samples"] == 10 and "top1_undecided" not in plain


def test_an_embedding_is_judged_by_cosine_worst_sample_and_ranking_not_a_logits_bound():
    """Unit vectors have small elements: an embedding at mean cosine ~0.997 (the T5-style encoder with
    SmoothQuant) fails max_norm_err 0.25 though it is good; under the embedding task's bounds it passes, and
    a few broken samples that the mean hides fail on the worst sample's cosine."""
    from quantverdict.run.judge_outputs import OutputJudge

    rng = np.random.default_rng(0)
    reference = rng.normal(size=(128, 384))
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    close = reference + rng.normal(scale=0.002, size=reference.shape)
    close[:, 7] += 0.07  # the error an outlier channel concentrates (what a logits bound reads as max_norm_err)
    close /= np.linalg.norm(close, axis=1, keepdims=True)
    judge = OutputJudge(ToleranceTable.load())
    as_logits = judge.tolerances.resolve("encoder", "int8", {})
    assert not compare({"e": reference}, {"e": close}, as_logits).passed  # the logits bound fails it
    comparison = judge.check(reference, close, "int8", name="encoder", task="embedding")
    assert comparison.metrics["output"]["cosine"] > 0.99 and comparison.task_metrics["row_cosine_min"] > 0.95
    broken = close.copy()
    broken[:3] = rng.normal(size=(3, 384)) / np.sqrt(384)  # three samples lost
    with pytest.raises(AssertionError, match="row_cosine_min"):
        judge.check(reference, broken, "int8", name="encoder", task="embedding")


@pytest.mark.parametrize("observed,bound,higher,said", [
    (0.9999994, 0.9999995, True, "cosine = 0.999999, must be ≥ 0.9999995"),  # was "must be ≥ 1"
    (0.96999991, 0.97, True, "cosine = 0.9699999, must be ≥ 0.97"),  # was "0.97, must be ≥ 0.97"
    (0.95, 0.97, True, "cosine = 0.95, must be ≥ 0.97"),
    (0.123456789, 0.1, False, "cosine = 0.123457, must be ≤ 0.1"),
    (float("nan"), 0.9, True, "cosine = nan, must be ≥ 0.9")])
def test_a_failed_check_shows_its_value_on_its_side_of_the_bound_and_the_bound_as_written(observed, bound, higher,
                                                                                          said):
    check = Check("y", "cosine", observed, bound, higher)
    assert not check.passed and check.describe() == f"y: {said}"



def test_the_first_diverging_layer_reads_its_cosine_beside_a_bound_as_written():
    """The first diverging layer's line had the same rounding: 'cosine 1.000000 < 1' for a bound of 0.9999999."""
    from quantverdict.judge.diagnose import _similarity

    diverged, details = _similarity(np.array([1.0, 0.0]), np.array([1.0, 1e-3]), 0.9999999)
    assert diverged and details["summary"] == "cosine 0.9999995 < 0.9999999"
