"""The product as users get it: the wheel built from this tree, installed (not editable) into a fresh
virtual environment, used from a repository that holds only a model package and a manifest, with
no file of this repository in reach: pytest -m int8, pytest --qv-baseline, and the CLI's init, run,
report and gate.

The virtual environment sees the packages of the Python running the tests, through a path file listing its
site-packages (torch, onnxruntime… are gigabytes a CI run should not install twice): whether that Python is the
system's, a virtual environment's (``--system-site-packages`` would show the *base* interpreter's packages
instead) or one whose packages come through PYTHONPATH (the GPU machine's). The package itself comes from the
wheel, which the test checks."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from user_repo import MANIFEST, MODEL

REPO = Path(__file__).resolve().parents[1]
@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with the wheel of this tree installed from the file, not from the tree."""
    problem = _wheel_build_problem()
    if problem:
        pytest.skip(problem)
    import shutil

    root = tmp_path_factory.mktemp("installed")
    source, wheels = root / "source", root / "wheels"  # built from a copy: the build writes build/ beside it
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".quantverdict-cache", ".whl", ".tox", "build", "reports", "*.egg-info", "__pycache__", ".hypothesis"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = wheels.glob("quantverdict-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=300)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(purelib) / "running-environment.pth").write_text("\n".join(_package_folders()) + "\n")
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    return root / "venv"


def _wheel_build_problem() -> str | None:
    """Why this environment cannot build the wheel without fetching a build backend (no network on a GPU machine),
    or None: setuptools 70.1 builds wheels by itself, 68 to 70.0 with the wheel package; a fresh Python 3.11 venv
    holds setuptools 65, which fails with "invalid command 'bdist_wheel'"."""
    import importlib.metadata
    import importlib.util

    try:
        found = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "building the wheel needs setuptools in this environment (pip install 'setuptools>=70.1')"
    version = tuple(int(part) for part in found.split(".")[:2] if part.isdigit())
    if version >= (70, 1) or (version >= (68, 0) and importlib.util.find_spec("wheel") is not None):
        return None
    return (f"building the wheel without network needs setuptools>=70.1 (or >=68 with wheel) in this environment; "
            f"it holds setuptools {found} (pip install 'setuptools>=70.1', as the dev extra does)")


def _package_folders() -> list[str]:
    """The folders the running Python imports packages from (site-packages, PYTHONPATH entries), less any that
    holds another copy of this package (this tree, an editable install's path, a carried wheel)."""
    folders = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if not path.is_dir() or (path / "quantverdict").exists() or path in (REPO, REPO / "tests"):
            continue
        if path.name in ("site-packages", "dist-packages") or entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            folders.append(str(path))
    return folders


@pytest.fixture
def user_repo(tmp_path: Path) -> Path:
    (tmp_path / "tinymodels").mkdir()
    (tmp_path / "tinymodels" / "__init__.py").write_text("")
    (tmp_path / "tinymodels" / "nets.py").write_text(MODEL)
    (tmp_path / "models.yaml").write_text(MANIFEST)
    return tmp_path


def _in(venv: Path, repo: Path, *command: str) -> subprocess.CompletedProcess:
    """``command`` run in the user's repository with the virtual environment's programs first on PATH, and
    no PYTHONPATH entry that holds another copy of the package (a GPU machine carries its dependencies so)."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    paths = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if entry and not (Path(entry) / "quantverdict").exists()]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=900)


def test_the_installed_wheel_serves_a_users_repository(venv, user_repo, tmp_path_factory):
    where = _in(venv, user_repo, "python", "-c", "import quantverdict; print(quantverdict.__file__)")
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr  # the wheel, not this tree

    init = _in(venv, user_repo, "quantverdict", "init")
    assert init.returncode == 0 and "models.yaml: exists, left alone" in init.stdout, init.stdout + init.stderr
    cache = tmp_path_factory.getbasetemp() / "installed-cache"
    with (user_repo / "pyproject.toml").open("a") as config:
        config.write(f'cache-dir = "{cache}"\n')

    tests = _in(venv, user_repo, "python", "-m", "pytest", "-m", "int8", "-q", "-p", "no:cacheprovider", "-rs")
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    [record] = (user_repo / "reports").glob("run-*.json")
    cases = json.loads(record.read_text())["cases"]
    assert {case["model"] for case in cases} == {"tiny"} and "models.yaml:" in tests.stdout  # its own cases only
    statuses = {case["backend"]: case["status"] for case in cases}
    assert statuses["onnxruntime"] == "passed" and set(statuses.values()) <= {"passed", "skipped"}, statuses
    counts = {status: list(statuses.values()).count(status) for status in ("passed", "skipped")}  # GPU runners run more
    assert f"{counts['passed']} passed, {counts['skipped']} skipped" in tests.stdout, tests.stdout[-2000:]

    run = _in(venv, user_repo, "quantverdict", "run", "--precisions", "fp32,int8", "--backends", "onnxruntime",
              "--report-dir", "cli")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [baseline] = (user_repo / "cli").glob("run-*.json")
    assert [case["id"] for case in json.loads(baseline.read_text())["cases"]] == [
        "tiny-fp32-onnxruntime", "tiny-int8-onnxruntime"]

    report = _in(venv, user_repo, "quantverdict", "report", str(baseline))
    assert report.returncode == 0 and baseline.with_suffix(".html").is_file(), report.stderr[-3000:]
    gate = _in(venv, user_repo, "quantverdict", "gate", "--baseline", str(baseline), "--current", str(baseline))
    assert gate.returncode == 0 and "0 regression(s)" in gate.stdout, gate.stdout + gate.stderr

    judged = _in(venv, user_repo, "python", "-m", "pytest", "-m", "int8 and onnxruntime", "-q", "-p",
                 "no:cacheprovider", "--qv-baseline", str(baseline))
    assert judged.returncode == 0 and "1 passed" in judged.stdout, judged.stdout[-3000:] + judged.stderr[-3000:]


def test_the_installed_wheel_requires_pytest(venv, tmp_path):
    """The plugin is the product: a fresh environment's ``pytest -m int8`` must find pytest and the plugin, not another
    pytest that collects nothing (exit 5) or none at all."""
    shown = _in(venv, tmp_path, "python", "-c", "import importlib.metadata as m; print(m.requires('quantverdict'))")
    assert shown.returncode == 0, shown.stderr
    assert any(requirement.startswith("pytest") for requirement in ast.literal_eval(shown.stdout)), shown.stdout
