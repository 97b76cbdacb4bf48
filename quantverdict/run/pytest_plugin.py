"""pytest plugin: options, markers and parametrization. All logic lives in :mod:`quantverdict.run.pipeline`.

Loaded by the repository's ``conftest.py`` (``pytest_plugins = ["quantverdict.run.pytest_plugin"]``).
Heavy imports happen inside hooks, so importing this module costs nothing.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

PRECISION_MARKERS = ("fp32", "tf32", "fp16", "bf16", "int8", "fp8", "fp4")
BACKEND_MARKERS = ("torch", "onnxruntime", "tensorrt", "tensorrt_rtx", "torch_quant")
OTHER_MARKERS = {"gpu": "needs an NVIDIA GPU", "slow": "large models (ResNet-50/101)",
                 "benchmark": "timing benchmarks; run only when selected (pytest -m benchmark)"}
RESULT_PROPERTY = "quantverdict_result"

_pipeline_key = pytest.StashKey["Any"]()
_results_key = pytest.StashKey[list]()
_started_key = pytest.StashKey[float]()


def _csv(value: str | None) -> list[str] | None:
    return [item.strip() for item in value.split(",") if item.strip()] if value else None


def _register_hypothesis_profiles() -> None:
    """``ci``: few, derandomised examples and no deadline (model builds are slow); ``nightly``: deep."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return
    common = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
    settings.register_profile("ci", max_examples=12, derandomize=True, print_blob=True, **common)
    settings.register_profile("nightly", max_examples=300, **common)


_register_hypothesis_profiles()  # before Hypothesis's own plugin reads --hypothesis-profile


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quantverdict", "quantized-model regression harness")
    group.addoption("--models", help="comma-separated model names (default: all registered)")
    group.addoption("--precisions", help="comma-separated precisions (default: all a backend offers)")
    group.addoption("--backends", help="comma-separated backends (default: all)")
    group.addoption("--tolerances", type=Path, help="tolerance table (default: fixtures/tolerances.yaml)")
    group.addoption("--manifest", type=Path, default=Path("fixtures/models.yaml"),
                    help="user model manifest (default: fixtures/models.yaml, if present)")
    group.addoption("--report-dir", type=Path, default=Path("reports"),
                    help="where the run's JSON record is written (default: reports/)")
    group.addoption("--cache-dir", type=Path, default=Path(".quantverdict-cache"),
                    help="artifact cache shared by runs and xdist workers (default: .quantverdict-cache/)")
    group.addoption("--calibration", help="calibration method for INT8/FP8: max (default), entropy, percentile, mse")
    group.addoption("--baseline", type=Path, help="run record to judge every case against under the gate's rules "
                                                  "(default: the ini option quantverdict_baseline, if set)")
    group.addoption("--shard", help="run part i of n of the accuracy matrix (i/n); 'python -m quantverdict merge' "
                                    "combines the records")
    group.addoption("--gate-policy", type=Path, help="gate policy for --baseline (default: fixtures/gate.yaml)")
    parser.addini("quantverdict_baseline", "default run record for --baseline", default="")


def pin_worker_gpu(worker: str | None, gpu_count: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES value for pytest-xdist worker ``gwN``: one GPU each, round robin."""
    if not worker or not worker.startswith("gw") or gpu_count < 2:
        return None
    return str(int(worker[2:]) % gpu_count)


def _gpu_count() -> int:
    """GPUs seen by the driver, counted without initialising CUDA in this process."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def pytest_configure(config: pytest.Config) -> None:
    import os

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and "CUDA_VISIBLE_DEVICES" not in os.environ:  # before anything initialises CUDA
        device = pin_worker_gpu(worker, _gpu_count())
        if device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = device
    for name in PRECISION_MARKERS:
        config.addinivalue_line("markers", f"{name}: cases in {name.upper()} precision")
    for name in BACKEND_MARKERS:
        config.addinivalue_line("markers", f"{name}: cases run on the {name} backend")
    for name, text in OTHER_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[_results_key] = []
    config.stash[_started_key] = time.time()
    config.pluginmanager.register(_RecordCollector(config), "quantverdict-record-collector")


def pipeline(config: pytest.Config) -> Any:
    """The session's :class:`quantverdict.run.pipeline.Pipeline`, made on first use."""
    if _pipeline_key not in config.stash:
        from quantverdict.run.pipeline import Pipeline

        baseline = config.getoption("baseline") or (Path(config.getini("quantverdict_baseline"))
                                                    if config.getini("quantverdict_baseline") else None)
        config.stash[_pipeline_key] = Pipeline(
            cache_dir=config.getoption("cache_dir"), tolerances=config.getoption("tolerances"),
            manifest=config.getoption("manifest"), calibration=config.getoption("calibration"),
            baseline=baseline, policy=config.getoption("gate_policy"))
    return config.stash[_pipeline_key]


@pytest.fixture(scope="session")
def qv_pipeline(request: pytest.FixtureRequest) -> Any:
    return pipeline(request.config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    pipe = pipeline(config)
    cases = pipe.cases(_csv(config.getoption("models")), _csv(config.getoption("precisions")),
                       _csv(config.getoption("backends")))
    if config.getoption("shard"):
        from quantverdict.run.cases import Shard

        cases = Shard.parse(config.getoption("shard")).select(cases)
    params = []
    for case in cases:
        marks = [getattr(pytest.mark, case.precision), getattr(pytest.mark, case.backend)]
        if pipe.models.get(case.model).slow:
            marks.append(pytest.mark.slow)
        if case.precision in pipe.backend(case.backend).gpu_precisions:
            marks.append(pytest.mark.gpu)
        params.append(pytest.param(case, id=case.id, marks=marks))
    metafunc.parametrize("case", params)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Benchmarks take minutes and need a quiet machine: they run only when ``-m`` names them."""
    if "benchmark" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="benchmarks run only when selected: pytest -m benchmark")
    for item in items:
        if item.get_closest_marker("benchmark"):
            item.add_marker(skip)


@pytest.fixture
def record_case(record_property: Any) -> Any:
    """Call with a :class:`CaseResult` to put it in the run record (works under pytest-xdist)."""

    def record(result: Any) -> None:
        record_property(RESULT_PROPERTY, result.to_dict())

    return record


class _RecordCollector:
    """Collects case results from test reports; under pytest-xdist the reports (with their
    ``user_properties``) arrive at the controller, so the record covers every worker."""

    def __init__(self, config: pytest.Config):
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == RESULT_PROPERTY and report.when == "call":
                self.config.stash[_results_key].append(value)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    results = config.stash[_results_key]
    if not results or hasattr(config, "workerinput"):  # xdist workers report to the controller
        return
    from quantverdict.capabilities import detect
    from quantverdict.report.record import build_record, write_record

    shard = config.getoption("shard")
    if shard:
        from quantverdict.run.cases import Shard

        shard = Shard.parse(shard).to_dict()
    record = build_record(results, detect(), config.stash[_started_key], shard=shard or None)
    path = write_record(record, config.getoption("report_dir"))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"quantverdict: run record written to {path}")
