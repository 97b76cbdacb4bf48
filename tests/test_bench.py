"""Timing helpers: statistics and the floor rule (no wall-clock asserts: speed lives in benchmarks)."""
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from quantverdict.perf.bench import Ratio, Timing, interleaved_ratio, time_call, warm_up


def fake_timing(ms: float) -> Timing:
    return Timing(ms, ms, ms, ms, 1, 1000 / ms)


def test_interleaved_ratio_reports_median_and_spread():
    base = itertools.cycle([10.0, 12.0, 11.0]).__next__
    fast = itertools.cycle([5.0, 4.0, 5.5]).__next__
    ratio = interleaved_ratio(lambda: fake_timing(base()), lambda: fake_timing(fast()), rounds=3)
    assert (ratio.low, ratio.median, ratio.high) == (2.0, 2.0, 3.0)


def test_a_floor_fails_only_when_the_whole_interval_is_below_it():
    assert not Ratio(median=1.9, low=1.7, high=2.1, rounds=5).below(2.0)  # noise straddles the floor
    assert Ratio(median=1.5, low=1.4, high=1.6, rounds=5).below(2.0)


def test_time_call_counts_every_repeat_and_synchronizes_inside():
    calls, syncs = [], []
    timing = time_call(lambda: calls.append(1), items=8, warmup=2, repeats=7, synchronize=lambda: syncs.append(1))
    warm = len(calls) - 7
    assert warm >= 4 and warm % 2 == 0  # at least two warm-up windows of 2, compared with each other
    assert len(syncs) == len(calls) and timing.repeats == 7
    assert timing.min_ms <= timing.median_ms <= timing.p90_ms <= timing.p99_ms


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: `quantverdict bench` measures instead")
def test_bench_without_a_gpu_says_so():
    proc = subprocess.run([sys.executable, "-m", "quantverdict", "bench"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: bench measures the GPU lane and needs a CUDA GPU; none found"


def _outside_xdist() -> dict[str, str]:
    """This environment without pytest-xdist's worker variables: a pytest started from an xdist worker inherits
    them, and pytest-benchmark then disables every benchmark (and writes an empty --benchmark-json)."""
    import os

    return {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}


def test_benchmark_history_compare_passes_twice_and_fails_when_slowed(tmp_path):
    """`--benchmark-autosave` twice, then `--benchmark-compare-fail=median:300%` passes; a run slowed
    by QUANTVERDICT_BENCH_SLOWDOWN_MS fails it. The planted 20 ms is ~400x the call (about 45 us here), so
    a 4x threshold detects it while a shared 2-core runner's noise (beyond 1.5x between runs twice
    in about 60 reruns, failing the 50% threshold this test had) cannot trip it: this proves pytest-benchmark's
    comparison path; judging small changes is compare-timings' job (Mann-Whitney over every round)."""

    root = Path(__file__).resolve().parent.parent
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "benchmark",
            "tests/test_benchmarks.py", "-k", "inference and cnn-fp32-onnxruntime-b1",
            f"--benchmark-storage=file://{tmp_path}"]

    def run(*extra: str, slowdown: str = "0") -> subprocess.CompletedProcess:
        env = {**_outside_xdist(), "QUANTVERDICT_BENCH_SLOWDOWN_MS": slowdown}
        return subprocess.run([*base, *extra], capture_output=True, text=True, cwd=root, env=env, timeout=600)

    for _ in range(2):
        saved = run("--benchmark-autosave")
        assert saved.returncode == 0, saved.stdout[-1500:]
    assert len(list(tmp_path.rglob("*.json"))) == 2
    same = run("--benchmark-compare", "--benchmark-compare-fail=median:300%")
    assert same.returncode == 0, same.stdout[-1500:]
    slowed = run("--benchmark-compare", "--benchmark-compare-fail=median:300%", slowdown="20")
    assert slowed.returncode != 0
    assert "Performance has regressed" in slowed.stdout + slowed.stderr


def test_each_xdist_worker_gets_its_own_gpu(monkeypatch):
    """Round robin over the host's GPUs, or over those CUDA_VISIBLE_DEVICES lists (indices or UUIDs): a job given
    two of a host's four spreads over those two; one GPU listed, or no xdist, leaves the setting as it is."""
    from quantverdict.capabilities import pin_worker_gpu, pin_xdist_worker_gpu

    assert [pin_worker_gpu(f"gw{i}", ["0", "1"]) for i in range(4)] == ["0", "1", "0", "1"]
    assert pin_worker_gpu("gw3", ["0"]) is None and pin_worker_gpu(None, [str(i) for i in range(8)]) is None
    for listed, worker, pinned in [("1,3", "gw0", "1"), ("1,3", "gw3", "3"), ("GPU-a, GPU-b", "gw1", "GPU-b"),
                                   ("2", "gw5", "2"), ("", "gw1", "")]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        pin_xdist_worker_gpu()
        assert os.environ["CUDA_VISIBLE_DEVICES"] == pinned, (listed, worker)


def test_a_package_each_worker_compiles_again_is_named_with_how_to_compile_it_once(tmp_path):
    """A package with no bytecode beside its source, where none is written (PYTHONDONTWRITEBYTECODE), is compiled
    again by every process that imports it: a run of several pytest-xdist workers names it and says how to compile
    it once; not once it is compiled, nor where the first import may write its bytecode (beside the source, or under
    a PYTHONPYCACHEPREFIX yet to be made), nor for one worker."""
    import compileall

    package = tmp_path / "site" / "heavy"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    code = ("from quantverdict.run.worker_startup import recompiled_note, uncompiled\n"
            "print(uncompiled('heavy')); print(recompiled_note(8, ['heavy'])); print(recompiled_note(1, ['heavy']))")
    base = {key: value for key, value in os.environ.items()
            if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    base["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])

    def said(**env: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                              check=True).stdout.splitlines()

    folder, note, alone = said(PYTHONDONTWRITEBYTECODE="1")
    assert folder == str(package) and alone == "None"
    assert note.startswith("each of the 8 pytest-xdist workers compiled heavy again") and \
        f"python -m compileall -q {package}" in note and "PYTHONPYCACHEPREFIX" in note
    assert said() == ["None"] * 3  # the first import writes it beside the source
    assert said(PYTHONPYCACHEPREFIX=str(tmp_path / "not" / "yet")) == ["None"] * 3
    compileall.compile_dir(str(package), quiet=1)
    assert said(PYTHONDONTWRITEBYTECODE="1") == ["None"] * 3


def test_each_xdist_worker_takes_its_share_of_the_cpus_for_torch_and_onnxruntime(pytester, monkeypatch):
    """``pytest -n 2``: each worker's torch and ONNX Runtime pools take half the CPUs, not one thread per core each
    (threads spinning in each other's barriers stall both workers); a user's own OMP_NUM_THREADS is left alone."""
    pytester.makepyfile(test_threads="""
import os, numpy as np, onnx, torch
from onnx import TensorProto, helper
from quantverdict.backends.onnxrt import OnnxRuntimeRunner

def test_threads():
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    expected = int(os.environ.get("USERS_OWN", share))
    graph = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]), opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8)
    with OnnxRuntimeRunner(graph.SerializeToString(), ["CPUExecutionProvider"], optimize=False) as runner:
        ort_threads = runner.session.get_session_options().intra_op_num_threads
    assert (torch.get_num_threads(), ort_threads) == (expected, share)
""")
    for name in ("OMP_NUM_THREADS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):  # this run's, under xdist
        monkeypatch.delenv(name, raising=False)
    assert pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider").ret == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("USERS_OWN", "2")
    assert pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider").ret == 0


def test_speedup_floors_load_as_data():
    from quantverdict.perf.speedup import load_floors

    floors = load_floors()
    assert {f.hardware for f in floors} == {"cpu", "gpu"} and all(f.floor > 0 for f in floors)
    assert "resnet18-int8-vs-fp32-onnxruntime-cpu-b32" in [f.id for f in floors]


def test_cpu_floor_applies_to_its_runner_class_only():
    import os

    from quantverdict.perf.speedup import Floor

    floor = Floor("resnet18", "onnxruntime", "cpu", 32, "fp32", "int8", 0.5, cpus=(os.cpu_count() or 1) + 1)
    assert f"floor measured for {floor.cpus}-CPU runners; this machine has {os.cpu_count()}" in floor.skip_reason()
    assert Floor("resnet18", "onnxruntime", "cpu", 32, "fp32", "int8", 0.5).skip_reason() is None


def test_warm_up_continues_until_two_windows_agree():
    import time

    # First calls slow and getting faster (lazy initialisation, autotuning), then steady at 5 ms.
    delays = iter([0.06, 0.04, 0.03, 0.02, 0.012, 0.008] + [0.005] * 100)
    calls = warm_up(lambda: time.sleep(next(delays)), window=3)
    assert calls >= 12  # two settling windows, then two steady windows that agree


def test_compare_timings_needs_both_a_ratio_and_significance(tmp_path):
    """Real saved runs: a clean rerun is 'same', a run slowed by 20 ms a round is 'regressed'."""
    import json
    import math

    root = Path(__file__).resolve().parent.parent
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "benchmark",
            "tests/test_benchmarks.py", "-k", "inference and cnn-fp32-onnxruntime-b1", "--benchmark-save-data"]

    def save(name: str, slowdown: str) -> Path:
        env = {**_outside_xdist(), "QUANTVERDICT_BENCH_SLOWDOWN_MS": slowdown}
        out = tmp_path / f"{name}.json"
        proc = subprocess.run([*base, f"--benchmark-json={out}"], capture_output=True, text=True, cwd=root, env=env,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-1500:]
        return out

    first, again, slowed = save("first", "0"), save("again", "0"), save("slowed", "20")
    # A 30-80 µs call timed in separate processes drifts between clean runs: ×1.53 on a shared 2-core host, ×4.06 on
    # the 16-core H100 host under pytest -n 8. The ratio asked is the geometric middle between no change and the
    # planted 20 ms (×250 and more), so that drift and the slowdown each stay an order of magnitude from it.
    median = json.loads(first.read_text())["benchmarks"][0]["stats"]["median"]
    ratio = math.sqrt((median + 20e-3) / median)
    compare = [sys.executable, "-m", "quantverdict", "compare-timings", "--ratio", f"{ratio:g}"]
    same = subprocess.run([*compare, str(first), str(again)], capture_output=True, text=True, cwd=root)
    assert same.returncode == 0 and f"0 regression(s) of 1 benchmark(s) (needs ×{ratio:g}" in same.stdout, same.stdout
    worse = subprocess.run([*compare, str(first), str(slowed)], capture_output=True, text=True, cwd=root)
    assert worse.returncode == 1 and "regressed" in worse.stdout, worse.stdout
    document = json.loads(first.read_text())
    del document["benchmarks"][0]["stats"]["data"]
    (tmp_path / "bare.json").write_text(json.dumps(document))
    bare = subprocess.run([*compare, str(tmp_path / "bare.json"), str(first)], capture_output=True, text=True, cwd=root)
    assert bare.returncode == 2 and "--benchmark-save-data" in bare.stderr


def _enter_slot(gpu: str, mark: Path) -> subprocess.Popen:
    """Another process (a second xdist worker) that takes ``gpu``'s timing slot and then writes ``mark``."""
    code = ("import sys; from pathlib import Path; from quantverdict.gpu_slot import timing_slot\n"
            "with timing_slot(sys.argv[1]):\n    Path(sys.argv[2]).write_text('in')\n")
    return subprocess.Popen([sys.executable, "-c", code, gpu, str(mark)])


def test_one_timing_loop_at_a_time_per_gpu_across_processes(tmp_path, monkeypatch):
    """While this process times on a GPU, another process's loop on that GPU waits; one on another GPU does not."""
    import tempfile

    from quantverdict.gpu_slot import timing_slot

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the slots' lock files: here, and in the other processes
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    held, other = f"GPU-test-{os.getpid()}-a", f"GPU-test-{os.getpid()}-b"
    with timing_slot(held):
        waiting, elsewhere = _enter_slot(held, tmp_path / "same"), _enter_slot(other, tmp_path / "other")
        assert elsewhere.wait(timeout=60) == 0 and (tmp_path / "other").exists()
        time.sleep(0.5)
        assert waiting.poll() is None and not (tmp_path / "same").exists()  # it waits while the slot is held
    assert waiting.wait(timeout=60) == 0 and (tmp_path / "same").exists()
