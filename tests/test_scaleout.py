"""What a nightly gains from a host's GPUs (pytest -m benchmark, on a host with two or more): GPU-bound cases —
torchvision CNNs at a deployment batch (64 × 3 × 224²), PyTorch on CUDA in FP32, TF32, FP16 and BF16, each timed —
run under pytest-xdist with four workers per GPU (one times at a time on each GPU: the others
prepare their next case meanwhile), pinned to one GPU and spread over all of them, side by side on a warm
cache, the longest cases first by the durations of a first (cold) run; each case by itself (``--dist load``) and a
model's cases on one worker (``--dist loadgroup``: its module, reference and data made once). Wall time goes to
pytest-benchmark, the ratios and each run's CPU-seconds to ``extra_info``, never into asserts, and with them where each
run's time went (a conftest in the run's folder writes when each case starts and ends): before the first case
(pytest and its workers starting), each worker's first case (its CUDA context, first kernels, model and data), the
cases after those, and after the last (workers ending, the report), so that a ratio short of the GPUs' count says
which part did not scale."""
import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.benchmark, pytest.mark.gpu, pytest.mark.slow]

NETS = textwrap.dedent("""\
    import torch
    import torchvision


    def seeded(name):
        torch.manual_seed(0)
        return getattr(torchvision.models, name)(weights=None).eval()
    """)
FACTORY = "\n\ndef {name}():\n    return seeded({name!r})\n"
MODELS = ["resnet50", "resnet101", "convnext_tiny", "efficientnet_b0", "mobilenet_v3_large", "densenet121",
          "regnet_y_3_2gf", "vit_b_16"]
TIMELINE = textwrap.dedent("""\
    import json, os, time


    def pytest_runtest_logstart(nodeid, location):
        _mark("start")


    def pytest_runtest_logfinish(nodeid, location):
        _mark("end")


    def _mark(what):
        if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("QV_TIMELINE"):
            with open(os.environ["QV_TIMELINE"], "a") as handle:
                handle.write(json.dumps([os.environ["PYTEST_XDIST_WORKER"], what, time.time()]) + "\\n")
    """)
ENTRY = """\
  - name: tv-{name}
    build: gpunets:{name}
    inputs: [{{name: image, shape: [64, 3, 224, 224], range: [0, 1]}}]
    outputs: [logits]
"""


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _phases(timeline: Path, began: float, ended: float) -> dict[str, float]:
    """Where a run's wall time went, from its workers' case starts and ends (``timeline``, wall clock) and the run's
    own ``began`` and ``ended``: until the first case starts, until every worker's first case has ended, until the
    last case ends, and after it."""
    marks = [json.loads(line) for line in timeline.read_text().splitlines()]
    first_ends: dict[str, float] = {}
    for worker, what, at in marks:
        if what == "end":
            first_ends.setdefault(worker, at)
    start = min(at for _, what, at in marks if what == "start")
    first_wave, last = max(first_ends.values()), max(at for _, what, at in marks if what == "end")
    return {"start_s": start - began, "first_cases_s": first_wave - start, "rest_s": last - first_wave,
            "end_s": ended - last}


def _nightly(root: Path, name: str, workers: int, pinned: bool, balance_by: Path | None,
             dist: str = "load") -> tuple[float, float, Path, dict[str, float]]:
    """One nightly run as a subprocess: (wall seconds, CPU-seconds of it and its workers, its run record, where its
    time went: :func:`_phases`)."""
    timeline = root / f"{name}.timeline"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | {"QV_TIMELINE": str(timeline)}
    if pinned:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), "--dist", dist,
               "models.yaml",
               "--qv-manifest=models.yaml",
               "--qv-backends", "torch", "--qv-precisions", "fp32,tf32,fp16,bf16", "--qv-time",
               f"--qv-report-dir={root / name}", f"--qv-cache-dir={root / 'cache'}"]
    if balance_by is not None:
        command.append(f"--qv-balance-by={balance_by}")
    before, start, began = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter(), time.time()
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=3600)
    wall, after, ended = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]  # 1: a verdict failed; timing ran
    [record] = (root / name).glob("run-*.json")
    return (wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), record,
            _phases(timeline, began, ended))


@pytest.mark.skipif(_gpus() < 2, reason=f"spreading a nightly over GPUs needs two or more CUDA GPUs ({_gpus()} here)")
def test_a_gpu_bound_nightly_spread_over_the_hosts_gpus(benchmark, tmp_path):
    (tmp_path / "gpunets.py").write_text(NETS + "".join(FACTORY.format(name=name) for name in MODELS))
    (tmp_path / "models.yaml").write_text("models:\n" + "".join(ENTRY.format(name=name) for name in MODELS))
    (tmp_path / "conftest.py").write_text(TIMELINE)
    gpus = _gpus()
    workers = 4 * gpus
    _, cold_cpu, first, _ = _nightly(tmp_path, "cold", workers, False, None)
    cases = json.loads(first.read_text())["cases"]
    assert {case["status"] for case in cases} <= {"passed", "failed"}, [case["message"] for case in cases]
    measured: dict[str, float] = {}
    for dist in ("load", "loadgroup"):
        for pinned in (True, False):
            label = f"{dist}-{'pinned' if pinned else 'spread'}"
            runs: list[tuple[float, float, dict[str, float]]] = []

            def nightly() -> None:
                wall, cpu, _, phases = _nightly(tmp_path, label, workers, pinned, first, dist)
                runs.append((wall, cpu, phases))

            if (dist, pinned) == ("loadgroup", False):
                benchmark.pedantic(nightly, rounds=1, iterations=1)
            else:
                nightly()
            measured[f"{label}_wall_s"], measured[f"{label}_cpu_s"] = runs[0][:2]
            measured.update({f"{label}_{phase}": seconds for phase, seconds in runs[0][2].items()})
        measured[f"{dist}_speedup"] = measured[f"{dist}-pinned_wall_s"] / measured[f"{dist}-spread_wall_s"]
        measured[f"{dist}_rest_speedup"] = measured[f"{dist}-pinned_rest_s"] / measured[f"{dist}-spread_rest_s"]
    benchmark.extra_info.update({"gpus": gpus, "workers": workers, "cases": len(cases), "cpus": os.cpu_count(),
                                 "cold_cpu_s": cold_cpu, **measured})
    print(f"\n{gpus} GPUs, {workers} workers, {len(cases)} cases, {os.cpu_count()} CPUs: " + ", ".join(
        f"{key} {value:.2f}" for key, value in measured.items()))
