"""Outputs sampled inside timed loops are checked against the accuracy pass (MLPerf TEST01): a
configuration that is fast because it computes something else cannot post its timing."""
import numpy as np
import pytest

from quantverdict.backends.base import Artifacts, Runner
from quantverdict.backends.onnxrt import OnnxRuntimeBackend, OnnxRuntimeRunner
from quantverdict.judge.timed import judge_timed_outputs
from quantverdict.judge.tolerances import Tolerance
from quantverdict.perf.bench import sample_positions, time_call
from quantverdict.precision import get_recipe
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline

TOLERANCE = Tolerance(min_cosine=0.999)


def test_time_call_keeps_what_the_first_middle_and_last_timed_calls_returned():
    calls = iter(range(10 ** 6))
    timing = time_call(lambda: next(calls), warmup=1, repeats=9)
    assert sample_positions(9) == {0, 4, 8}
    first_timed = timing.sampled[0]
    assert timing.sampled == (first_timed, first_timed + 4, first_timed + 8)
    assert "sampled" not in timing.to_dict()


def test_identical_samples_pass_and_wrong_ones_fail_on_the_tolerance():
    rng = np.random.default_rng(0)
    reference = {"y": rng.standard_normal((8, 10)).astype(np.float32)}
    judged = {"y": reference["y"] + 1e-3 * rng.standard_normal((8, 10)).astype(np.float32)}
    same = judge_timed_outputs(judged, [judged, dict(judged)], reference, TOLERANCE)
    assert same.passed and same.identical == 2 and same.max_abs_diff == 0.0
    jitter = {"y": judged["y"] + np.float32(1e-6)}  # non-deterministic reductions: not equal, still accurate
    close = judge_timed_outputs(judged, [judged, jitter], reference, TOLERANCE)
    assert close.passed and close.identical == 1 and 0 < close.max_abs_diff < 1e-5
    wrong = judge_timed_outputs(judged, [judged, {"y": np.zeros_like(judged["y"])}], reference, TOLERANCE)
    assert not wrong.passed and "1 of 2 differ" in wrong.explain() and "cosine" in wrong.explain()
    missing = judge_timed_outputs(judged, [{}], reference, TOLERANCE)
    assert not missing.passed and missing.max_abs_diff == float("inf")


class WarmSwitchRunner(Runner):
    """A planted defect, on real ONNX Runtime sessions: after the accuracy pass's calls it runs a
    cheaper graph (the FP4-weight one), as a runtime that rebuilds a faster engine once warm would."""

    name = "warm-switch"

    def __init__(self, judged: OnnxRuntimeRunner, cheap: OnnxRuntimeRunner, honest_calls: int):
        self.judged, self.cheap, self.honest_calls, self.calls = judged, cheap, honest_calls, 0

    def activate_impl(self) -> None:
        self.judged.activate()
        self.cheap.activate()

    def infer_impl(self, feed):
        self.calls += 1
        return (self.judged if self.calls <= self.honest_calls else self.cheap).infer(feed)

    def deactivate_impl(self) -> None:
        self.judged.deactivate()
        self.cheap.deactivate()


def _warm_switch_backend(pipeline: Pipeline) -> type:
    class WarmSwitchBackend(OnnxRuntimeBackend):
        name = "warm-switch"

        def load(self, artifacts: Artifacts) -> Runner:
            model = artifacts.spec.name
            cheap = pipeline.store.precision_onnx(model, get_recipe("fp4"))
            honest = len(pipeline.store.eval_batches(model))
            return WarmSwitchRunner(OnnxRuntimeRunner(artifacts.onnx_path(), ["CPUExecutionProvider"], True),
                                    OnnxRuntimeRunner(cheap, ["CPUExecutionProvider"], True), honest)

    return WarmSwitchBackend


@pytest.mark.onnxruntime
def test_a_runtime_that_switches_graphs_when_warm_fails_its_timed_case(tmp_path):
    pipeline = Pipeline(tmp_path / "cache", timing=True)
    pipeline.backends.add("warm-switch", _warm_switch_backend(pipeline))
    honest = pipeline.run(Case("cnn", "fp32", "onnxruntime"))
    assert honest.status == "passed", honest.message
    assert honest.metrics["timed_outputs"] == {"samples": 3, "identical": 3, "max_abs_diff": 0.0, "passed": True}
    switched = pipeline.run(Case("cnn", "fp32", "warm-switch"))
    assert switched.status == "failed"
    assert switched.metrics["metrics"] == honest.metrics["metrics"]  # the accuracy pass alone saw nothing
    assert switched.metrics["timed_outputs"]["identical"] == 0 and not switched.metrics["timed_outputs"]["passed"]
    assert "outputs sampled inside the timed loop are not what was judged: 3 of 3" in switched.message
