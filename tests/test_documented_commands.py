"""Every command and option README gives runs in a test, not only parses: the commands no other test module ran
(``env``, ``sensitivity``, ``mutate``, ``compare-recipes --precision``, ``bench --model --batches``) run here on the
smallest built-in models, and a walk over README and the test modules finds a module that runs each documented
subcommand with each of its documented options."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_documented import _documented

TESTS = Path(__file__).resolve().parent


def harness(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quantverdict", *args, "--cache-dir", str(tmp_path / "cache")]
                          if args[0] != "env" else [sys.executable, "-m", "quantverdict", *args],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)


def test_env_reports_the_packages_and_the_precision_matrix(tmp_path):
    proc = harness(tmp_path, "env")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert "onnxruntime" in json.dumps(report) and "int8" in json.dumps(report)
    assert report["matrix_device"] == ("cpu" if report["gpu"] is None else f"cuda {report['gpu']['name']}")
    proc = subprocess.run([sys.executable, "-m", "quantverdict", "env"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "QUANTVERDICT_MATRIX_DEVICE": "tpu"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and \
        "error: QUANTVERDICT_MATRIX_DEVICE='tpu': expected one of auto, cpu, cuda" in proc.stderr.splitlines(), proc.stderr


def test_sensitivity_ranks_every_layer_and_says_whether_the_bound_is_met(tmp_path):
    proc = harness(tmp_path, "sensitivity", "cnn", "--min-cosine", "0.5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("/")]
    assert len(rows) >= 3 and "cosine ≥ 0.5 met with 0 layer(s) kept in FP32" in proc.stdout


def test_compare_recipes_takes_the_precision_readme_names(tmp_path):
    proc = harness(tmp_path, "compare-recipes", "cnn", "--precision", "fp8", "--variant", "mse:calibration=mse")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "harness" in proc.stdout and "\nmse " in proc.stdout


def test_mutate_plants_the_catalogue_and_counts_what_is_caught(tmp_path):
    proc = harness(tmp_path, "mutate", "--models", "mlp", "--reruns", "1", "--min-power", "0",
                   "--json", str(tmp_path / "mutations.json"))
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and json.loads((tmp_path / "mutations.json").read_text())


@pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                                   capture_output=True).returncode != 0,
                    reason="quantverdict bench times torch on CUDA: no CUDA GPU here")
def test_bench_times_the_model_and_batches_readme_names(tmp_path):
    proc = harness(tmp_path, "bench", "--model", "cnn", "--batches", "1,4", "--precisions", "fp32,bf16")
    assert proc.returncode == 0, proc.stderr[-2000:]


def _strings(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_every_documented_subcommand_and_option_runs_in_some_test_module():
    modules = [_strings(path) for path in TESTS.glob("test_*.py")]
    missing = []
    for command, options in sorted(_documented().items()):
        running = [strings for strings in modules if command in strings]
        missing += [f"{command} {option}" for option in sorted(options) if not any(
            option in strings or any(s.startswith(option + "=") for s in strings) for strings in running)]
        if not running:
            missing.append(command)
    assert not missing, f"documented in README, run by no test: {missing}"
