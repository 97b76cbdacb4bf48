"""Names have one source, the registries, and an installed package extends them through entry points: a
backend and a recipe, each a module of the package and one entry point, run through the CLI and are
selected by the pytest markers the plugin derives from the registries."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

BACKEND = textwrap.dedent('''\
    """ONNX Runtime with every graph optimisation off: another way to run any recipe's graph."""
    from quantverdict.backends.onnxrt import OnnxRuntimeBackend, OnnxRuntimeRunner


    class AsWritten(OnnxRuntimeBackend):
        name = "onnxruntime_as_written"

        def load(self, artifacts):
            return OnnxRuntimeRunner(artifacts.onnx_path(), ["CPUExecutionProvider"], optimize=False)

        def outputs_key(self, artifacts, caps):
            return None  # always run
    ''')
RECIPE = textwrap.dedent('''\
    """A precision that keeps FP32 (a stand-in for a package's own recipe)."""
    from quantverdict.precision.base import Recipe


    class Fp32Copy(Recipe):
        name = "fp32copy"


    FP32_COPY = Fp32Copy()
    ''')


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """An installed package (a dist-info beside its modules on the path) registering both."""
    root = tmp_path_factory.mktemp("extension")
    (root / "qvextra").mkdir()
    (root / "qvextra" / "__init__.py").write_text("")
    (root / "qvextra" / "backend.py").write_text(BACKEND)
    (root / "qvextra" / "recipe.py").write_text(RECIPE)
    info = root / "qvextra-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: qvextra\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[quantverdict.backends]\nonnxruntime_as_written = qvextra.backend:AsWritten\n"
                                           "\n[quantverdict.precisions]\nfp32copy = qvextra.recipe:FP32_COPY\n")
    return root


def _with(package: Path, *command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(package), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_a_backend_and_a_recipe_from_an_installed_package_run_through_the_cli(package, tmp_path):
    run = _with(package, "-m", "quantverdict", "run", "--models", "mlp", "--precisions", "fp32,fp32copy,int8",
                "--backends", "onnxruntime,onnxruntime_as_written", "--cache-dir", str(tmp_path / "cache"),
                "--report-dir", str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [record] = tmp_path.glob("run-*.json")
    cases = {case["id"]: case for case in json.loads(record.read_text())["cases"]}
    assert set(cases) == {f"mlp-{p}-{b}" for p in ("fp32", "fp32copy", "int8")
                          for b in ("onnxruntime", "onnxruntime_as_written")}
    assert all(case["status"] == "passed" for case in cases.values()), cases
    assert "optimisations off" in cases["mlp-int8-onnxruntime_as_written"]["metrics"]["runtime"]


def test_the_plugins_markers_come_from_the_registries(package):
    listed = _with(package, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "fixtures/models.yaml",
                   "--qv-models", "mlp", "-m", "fp32copy and onnxruntime_as_written")
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    assert [line for line in listed.stdout.splitlines() if "::" in line] == [
        "fixtures/models.yaml::mlp-fp32copy-onnxruntime_as_written"]
    markers = _with(package, "-m", "pytest", "--markers", "-p", "no:cacheprovider").stdout
    assert "@pytest.mark.fp32copy: cases in FP32COPY precision" in markers
    assert "@pytest.mark.onnxruntime_as_written: cases run on the onnxruntime_as_written backend" in markers
