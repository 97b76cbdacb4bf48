"""The pytest plugin's run record: each case's result collected from the test reports (under pytest-xdist every
worker's reaches the controller, and a crashed worker's case is an error naming the crash), written once the cases
have all reported. Cheap to import: the plugin imports it in every pytest run of the environment."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import pytest

    from quantverdict.run.cases import Case
    from quantverdict.run.settings import Settings

RESULT_PROPERTY = "quantverdict_result"  # the user property a case item reports its result under


class SessionRecord:
    """A pytest plugin object: the results of this session's cases, and the record they make."""

    def __init__(self, settings: "Settings", cases: Callable[[], list["Case"]]):
        """``cases``: the whole matrix the settings name (a shard is a part of it)."""
        self.settings, self.cases = settings, cases
        self.results: list[dict[str, Any]] = []
        self.finished: set[str] = set()  # items whose teardown (or worker's crash) has reported
        self.started = time.time()

    def pytest_runtest_logreport(self, report: "pytest.TestReport") -> None:
        if report.when in ("teardown", "???"):
            self.finished.add(report.nodeid)
        for name, value in report.user_properties:
            if name == RESULT_PROPERTY and report.when == "call":
                self.results.append(value)
        if report.when == "???" and report.failed:  # pytest-xdist's report of a worker that crashed on this item
            crashed = self._crashed(report)
            if crashed is not None:
                self.results.append(crashed)

    def _crashed(self, report: "pytest.TestReport") -> dict[str, Any] | None:
        """The case a crashed worker was running, as an ``error`` result naming the crash (else it would vanish
        from the record, and a gate against a full baseline would pass)."""
        from quantverdict.run.cases import CaseResult

        case_id = report.nodeid.rpartition("::")[2].partition("@")[0]  # --dist loadgroup appends "@group"
        case = next((case for case in self.cases() if case.id == case_id), None)
        what = str(report.longrepr).strip().splitlines()[0] if report.longrepr else "its worker crashed"
        return None if case is None else CaseResult(case, "error", f"{case.id}: {what}").to_dict()

    def write(self, reporter: Any, interrupted: bool, selected: int) -> None:
        """The record of the results, and a line saying where it is (``reporter``: pytest's terminal reporter, or
        None); none for a session that judged no case, nor for one interrupted before each of its ``selected`` items
        had finished (a Ctrl-C while pytest-xdist's workers shut down is after): no record may claim a run that did not
        finish."""
        if not self.results:
            return
        say = reporter.write_line if reporter is not None else (lambda line, **markup: None)
        if interrupted and len(self.finished) < selected:
            say("quantverdict: interrupted: no run record written")
            return
        if interrupted:
            say("quantverdict: interrupted after every selected test had finished")
        from quantverdict.capabilities import detect
        from quantverdict.errors import HarnessError
        from quantverdict.report.record import build_record, record_run
        from quantverdict.run.shards import shard_of

        try:
            shard = shard_of(self.settings["shard"], self.settings["balance-by"], self.cases())
        except HarnessError as exc:
            say(f"quantverdict: error: {exc}", red=True, bold=True)
            return
        record = build_record(self.results, detect(), self.started, shard=shard.to_dict() if shard else None)
        try:
            path, problem = record_run(record, self.settings["report-dir"], self.settings["history-db"])
        except HarnessError as exc:
            path, problem = None, str(exc)
        if path is not None:
            say(f"quantverdict: run record written to {path}")
        if problem:
            say(f"quantverdict: error: {problem}", red=True, bold=True)
