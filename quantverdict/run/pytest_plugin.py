"""pytest plugin (registered through the ``pytest11`` entry point): the manifest's model × precision ×
backend cases as test items, markers, options, the run record, and the ``quantverdict`` fixture.

It does nothing until a manifest is configured (``[tool.quantverdict] manifest = "models.yaml"`` in
pyproject.toml, ``qv_manifest = models.yaml`` in pytest's ini file, or ``--qv-manifest``): pytest
loads it in every run of an environment where the package is installed. Configured, the manifest
file is collected like a test file, one item per case, so ``pytest -m int8`` judges a repository's
models without any test code. All logic lives in :mod:`quantverdict.run.pipeline`; this module
imports nothing heavy until a hook needs it.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator, Iterator

import pytest

from quantverdict.run.plugin_record import RESULT_PROPERTY, SessionRecord

if TYPE_CHECKING:
    from quantverdict.run.cases import Case
    from quantverdict.run.judge_outputs import OutputJudge
    from quantverdict.run.pipeline import Pipeline
    from quantverdict.run.settings import Settings

OTHER_MARKERS = {"gpu": "needs an NVIDIA GPU", "slow": "large models (ResNet-50/101)",
                 "benchmark": "timing benchmarks; run only when selected (pytest -m benchmark)"}

_settings_key = pytest.StashKey["Settings"]()
_pipeline_key = pytest.StashKey["Pipeline"]()
_record_key = pytest.StashKey[SessionRecord]()


def pytest_addoption(parser: pytest.Parser) -> None:
    from quantverdict.run.settings import INI_PREFIX, PYTEST_PREFIX, SETTINGS, add_options

    group = parser.getgroup("quantverdict", "quantized-model regression harness (quantverdict)")
    add_options(group.addoption, prefix=PYTEST_PREFIX)
    for setting in SETTINGS.values():
        parser.addini(INI_PREFIX + setting.dest, setting.help, type="linelist" if setting.kind == "list" else "string")


def pytest_configure(config: pytest.Config) -> None:
    from quantverdict.backends import backend_registry
    from quantverdict.precision import known_precisions

    for name in known_precisions():  # the registries' names (installed packages' too): listing imports nothing
        config.addinivalue_line("markers", f"{name}: cases in {name.upper()} precision")
    for name in backend_registry().names():
        config.addinivalue_line("markers", f"{name}: cases run on the {name} backend")
    for name, text in OTHER_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    _check_markexpr(config, known_precisions())
    settings = _resolve(config)
    config.stash[_settings_key] = settings
    config.stash[_record_key] = SessionRecord(settings, functools.partial(_cases, config))
    config.pluginmanager.register(config.stash[_record_key], "quantverdict-record")
    from quantverdict.run.interrupt import note_sigint

    note_sigint()  # a KeyboardInterrupt without a Ctrl-C is the user's code's error, not the end of the run
    from quantverdict.capabilities import pin_xdist_worker_gpu, share_cpus_among_xdist_workers

    pin_xdist_worker_gpu()  # before anything initialises CUDA
    share_cpus_among_xdist_workers()  # before anything starts torch's thread pool
    manifest = settings["manifest"]
    if manifest is None:
        return
    if not manifest.is_file():
        raise pytest.UsageError(f"quantverdict: the configured manifest {manifest} does not exist")
    pipeline(config)  # reads and checks the manifest now: a bad field is a usage error, not a traceback
    _check_destinations(settings)
    if config.args_source != pytest.Config.ArgsSource.ARGS and not any(
            manifest.is_relative_to(Path(arg).resolve()) for arg in config.args if Path(arg).exists()):
        config.args.append(str(manifest))  # testpaths elsewhere: the manifest's cases are collected too


PRECISION_LIKE = re.compile(r"\b((?:u?int|fp|bf|tf)\d+)\b")


def _check_markexpr(config: pytest.Config, known: list[str]) -> None:
    """``-m int9`` deselected every case and ended with exit 5 and no word: a precision-like name in ``-m`` that is no
    precision and no marker of the project's is a usage error naming the closest precision."""
    from quantverdict.documents import suggest

    markers = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    for name in PRECISION_LIKE.findall(config.getoption("markexpr") or ""):
        if name not in known and name not in markers:
            raise pytest.UsageError(f"quantverdict: -m names no precision{suggest(name, known)}")


def _check_destinations(settings: "Settings") -> None:
    """A report folder or history that cannot be written is found before the matrix runs."""
    from quantverdict.errors import HarnessError
    from quantverdict.report.record import check_destinations

    try:
        check_destinations(settings["report-dir"], settings["history-db"], settings["cache-dir"])
    except HarnessError as exc:
        raise pytest.UsageError(f"quantverdict: {exc}") from None


def _resolve(config: pytest.Config) -> "Settings":
    from quantverdict.documents import DocumentError
    from quantverdict.run.settings import INI_PREFIX, SETTINGS, Settings

    given = {setting.dest: config.getoption(setting.dest, None) for setting in SETTINGS.values()}
    ini: dict[str, tuple[Any, Path]] = {}
    folder = config.inipath.parent if config.inipath else config.rootpath
    for name, setting in SETTINGS.items():
        value = config.getini(INI_PREFIX + setting.dest)
        if value:
            ini[name] = (value, folder)
    try:
        return Settings.resolve(given, config.invocation_params.dir, ini, root=config.rootpath)
    except DocumentError as exc:
        raise pytest.UsageError(f"quantverdict: {exc}") from None


def pipeline(config: pytest.Config) -> "Pipeline":
    """The session's :class:`quantverdict.run.pipeline.Pipeline`, made on first use."""
    if _pipeline_key not in config.stash:
        from quantverdict.errors import HarnessError
        from quantverdict.run.pipeline import Pipeline

        try:
            config.stash[_pipeline_key] = Pipeline.from_settings(config.stash[_settings_key],
                                                                 progress=functools.partial(_say, config))
        except HarnessError as exc:
            raise pytest.UsageError(f"quantverdict: {exc}") from None
    return config.stash[_pipeline_key]


def _cases(config: pytest.Config) -> list["Case"]:
    """The cases this session selects (none without a manifest)."""
    settings = config.stash[_settings_key]
    if settings["manifest"] is None:
        return []
    return pipeline(config).cases(settings["models"], settings["precisions"], settings["backends"])


def _say(config: pytest.Config, line: str) -> None:
    """A progress line (a recipe search's) on the terminal now, through the output capture."""
    import contextlib
    import sys

    capture, reporter = (config.pluginmanager.get_plugin(name) for name in ("capturemanager", "terminalreporter"))
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        if reporter is not None:
            reporter.write_line(f"quantverdict: {line}")
        else:  # an xdist worker: its stderr is the controller's
            print(f"quantverdict: {line}", file=sys.stderr, flush=True)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    manifest = parent.config.stash[_settings_key]["manifest"]
    if manifest is not None and file_path.resolve() == manifest:
        return ManifestFile.from_parent(parent, path=file_path)
    return None


class ManifestFile(pytest.File):
    """The manifest as a test file: one item per case of its models (and the registered models it
    includes, or those ``--qv-models`` names), marked by precision and backend."""

    def collect(self) -> Iterator["CaseItem"]:
        from quantverdict.errors import HarnessError
        from quantverdict.run.shards import in_order, xdist_workers
        from quantverdict.run.manifest import declaration_lines

        settings, pipe = self.config.stash[_settings_key], pipeline(self.config)
        grouped = bool(getattr(self.config.option, "loadgroup", False))  # a worker's: xdist sets its dist to "no"
        try:
            cases = in_order(pipe.cases(settings["models"], settings["precisions"], settings["backends"]),
                             settings["shard"], settings["balance-by"], xdist_workers(), grouped)
        except HarnessError as exc:
            raise pytest.UsageError(f"quantverdict: {exc}") from None
        lines = declaration_lines(self.path.read_text(encoding="utf-8"))
        for case in cases:
            # under --dist loadgroup, named <case>@<model>: xdist's scheduler groups by that suffix, which xdist writes
            # into a private node-id field pytest 9.2 no longer reads (pytest-xdist#1386), so it stopped grouping
            item = CaseItem.from_parent(self, name=f"{case.id}@{case.model}" if grouped else case.id, case=case,
                                        line=lines.get(case.model, lines.get("", 0)))
            item.add_marker(case.precision)
            item.add_marker(case.backend)
            if pipe.models.get(case.model).slow:
                item.add_marker("slow")
            if case.precision in pipe.backend(case.backend).gpu_precisions:
                item.add_marker("gpu")
            yield item


class CaseNotPassed(Exception):
    """A case that failed or errored; its message is the whole report (no traceback of the harness)."""


class CaseFailed(CaseNotPassed):
    """A verdict: the case ran and missed a bound (``xfail(raises=CaseFailed)`` expects a miss, never a crash)."""


class CaseErrored(CaseNotPassed):
    """The case could not be judged: a build, an export or the user's own code failed."""


class CaseItem(pytest.Item):
    def __init__(self, *, case: "Case", line: int = 0, **kwargs: Any):
        super().__init__(**kwargs)
        self.case, self.line = case, line

    def runtest(self) -> None:
        result = pipeline(self.config).run(self.case)
        self.user_properties.append((RESULT_PROPERTY, result.to_dict()))
        if result.status == "skipped":  # reported at the case's item, not at this line
            raise pytest.skip.Exception(result.message, _use_item_location=True)
        if result.status != "passed":
            error = CaseFailed if result.status == "failed" else CaseErrored
            raise error(result.message or f"{self.case.id}: {result.status}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CaseNotPassed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, self.line, self.case.id


@pytest.fixture(scope="session")
def qv_pipeline(request: pytest.FixtureRequest) -> "Pipeline":
    """The session's pipeline (models, artifacts, backends), for tests that drive cases themselves."""
    return pipeline(request.config)


@pytest.fixture
def quantverdict(request: pytest.FixtureRequest, record_property: Any) -> "OutputJudge":
    """Judge your own outputs against your own reference under a precision's tolerances, recorded in
    the run record: ``quantverdict.check(reference, outputs, "int8", name="my-net")``."""
    from quantverdict.run.judge_outputs import OutputJudge

    return OutputJudge(pipeline(request.config).tolerances,
                       lambda result: record_property(RESULT_PROPERTY, result.to_dict()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Benchmarks take minutes and need a quiet machine: they run only when ``-m`` names them."""
    if "benchmark" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="benchmarks run only when selected: pytest -m benchmark")
    for item in items:
        if item.get_closest_marker("benchmark"):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Recipes searched in this run or locked for another graph, workers that each compiled PyTorch again; and a
    repository holding a manifest that no setting names runs none of its cases: say how to name it."""
    settings = config.stash.get(_settings_key, None)
    if settings is None:
        return
    from quantverdict.run.settings import unnamed_manifest
    from quantverdict.run.worker_startup import recompiled_note
    from quantverdict.tune.lock import run_notes

    workers = getattr(config.option, "numprocesses", None)  # pytest-xdist's -n, a number once it has resolved it
    for line in [*run_notes(config.stash[_record_key].results, settings["lock"]),
                 *filter(None, [recompiled_note(workers if isinstance(workers, int) else 0)])]:
        terminalreporter.write_line(f"quantverdict: {line}")
    if settings["manifest"] is None:
        for line in unnamed_manifest(config.rootpath, exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED):
            terminalreporter.write_line(f"quantverdict: {line}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Generator[None, object, object]:
    """The record is written before every other plugin's session end, pytest-xdist's shutdown of its workers among
    them: a Ctrl-C there finds every case reported and the record written, and ends pytest as interrupted with one
    line, not a traceback of the shutdown."""
    record = session.config.stash.get(_record_key, None)
    if record is not None and not hasattr(session.config, "workerinput"):  # xdist workers report to the controller
        record.write(session.config.pluginmanager.get_plugin("terminalreporter"),
                     exitstatus == pytest.ExitCode.INTERRUPTED, session.testscollected)
    try:
        return (yield)
    except KeyboardInterrupt:
        _say(session.config, "interrupted while pytest shut down, after every case had reported")
        session.exitstatus = pytest.ExitCode.INTERRUPTED
        return None
