"""Regression policy over history: planted steps found at their run, no alarm on noise, one bad run
suspicious and two a regression; a real 20-run history on this machine."""
import numpy as np
import pytest

from harness.judge.changepoint import Policy, classify
from harness.report.history import judge_history, load_policies
from harness.run.cli import main

NIGHTLY_TIME = load_policies(None, "nightly")["time"]


def _series(rng, step, cv, n=60, at=30):
    values = 10.0 * (1 + cv * rng.standard_normal(n))
    values[at:] *= 1 + step
    return values


@pytest.mark.parametrize("step,cv,power", [(0.05, 0.01, 0.95), (0.05, 0.02, 0.95), (0.10, 0.01, 0.95),
                                           (0.10, 0.02, 0.95), (0.10, 0.05, 0.90)])
def test_planted_latency_steps_are_found_at_their_run(step, cv, power):
    rng = np.random.default_rng(7)
    verdicts = [classify(_series(rng, step, cv), NIGHTLY_TIME, higher_is_better=False) for _ in range(40)]
    found = [v.state == "regression" and abs(v.steps[-1].index - 30) <= 2 for v in verdicts]  # the run, ±2
    assert np.mean(found) >= power


def test_step_free_series_raise_no_regression():
    rng = np.random.default_rng(11)
    states = [classify(_series(rng, 0.0, cv), NIGHTLY_TIME, False).state
              for cv in (0.01, 0.02, 0.03, 0.05) for _ in range(50)]
    assert states.count("regression") == 0, {s: states.count(s) for s in set(states)}


def test_one_bad_run_is_suspicious_and_two_are_a_regression():
    rng = np.random.default_rng(3)
    values = _series(rng, 0.0, 0.02, n=30)
    one = values.copy()
    one[-1] *= 1.3
    two = values.copy()
    two[-2:] *= 1.3
    assert classify(one, NIGHTLY_TIME, False).state == "suspicious"
    assert classify(two, NIGHTLY_TIME, False).state == "regression"
    assert classify(values[:3], NIGHTLY_TIME, False).state == "insufficient data"
    assert classify(_series(rng, -0.2, 0.02), NIGHTLY_TIME, False).state == "improvement"


def test_a_real_history_with_a_slowdown_and_an_accuracy_change(tmp_path, monkeypatch):
    """20 runs of this harness on this machine: 20 ms slower per call from run 12, and INT8 calibrated
    by MSE instead of max from run 12 (+0.4 dB); both are found at run 12, nothing else moves."""
    for run in range(1, 21):
        monkeypatch.setenv("HARNESS_BENCH_SLOWDOWN_MS", "20" if run >= 12 else "0")
        calibration = "mse" if run >= 12 else "max"
        code = main(["run", "--models", "mlp", "--precisions", "fp32,int8", "--backends", "onnxruntime", "--time",
                     "--calibration", calibration, "--report-dir", str(tmp_path), "--cache-dir", str(tmp_path / "cache")])
        assert code == 0
    verdicts = {(v.case_id, v.metric): v.verdict for v in judge_history(tmp_path / "history.sqlite",
                                                                        load_policies(None, "nightly"))}
    latency = verdicts[("mlp-fp32-onnxruntime", "latency_ms")]
    assert latency.state == "regression" and latency.steps[-1].index == 11
    recipe = verdicts[("mlp-int8-onnxruntime", "recipe_snr_db")]
    assert recipe.state in ("regression", "improvement") and recipe.steps[-1].index == 11
    assert verdicts[("mlp-fp32-onnxruntime", "snr_db")].state == "stable"
    assert main(["history", "--db", str(tmp_path / "history.sqlite")]) == 1
