"""The run history: every run record's headline metrics in one SQLite file, judged per series.

SQLite (the standard library's) rather than a folder of JSON files: appends from parallel CI jobs
are transactions (no half-written history), and a series for one case, metric and runner class
is an indexed query even at 1,000 runs × 500 cases. Series never mix runner classes.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from quantverdict.documents import load
from quantverdict.errors import HarnessError
from quantverdict.judge.changepoint import Policy, Verdict, classify
from quantverdict.report.schema import CaseRecord, RunRecord

# metric → (higher is better, kind for the policy's thresholds)
METRICS = {"latency_ms": (False, "time"), "items_per_s": (True, "time"), "build_s": (False, "time"),
           "cosine": (True, "cosine"), "snr_db": (True, "snr"), "recipe_snr_db": (True, "snr"),
           "accuracy": (True, "accuracy")}
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, started TEXT, git_commit TEXT, runner_class TEXT,
                                 packages TEXT);
CREATE TABLE IF NOT EXISTS points (run_id TEXT, case_id TEXT, metric TEXT, value REAL,
                                   PRIMARY KEY (run_id, case_id, metric));
CREATE INDEX IF NOT EXISTS points_series ON points (case_id, metric);
CREATE TABLE IF NOT EXISTS statuses (run_id TEXT, case_id TEXT, status TEXT, PRIMARY KEY (run_id, case_id));
CREATE TABLE IF NOT EXISTS whole_runs (run_id TEXT PRIMARY KEY);
"""
JUDGED = ("passed", "failed")
UNCHECKED = ("unchecked         completeness: this history was written before each case's status was kept, so a case "
             "a run stopped judging cannot be told (runs appended from now on are checked)")


def case_metrics(case: CaseRecord) -> dict[str, float]:
    """The headline numbers of one case of a run record, by the names in ``METRICS``."""
    metrics, first = case.metrics, case.metrics.measured()
    out = {"cosine": first.cosine, "snr_db": first.snr_db,
           "recipe_snr_db": metrics.recipe.measured().snr_db if metrics.recipe else None,
           "accuracy": metrics.task.accuracy if metrics.task else None,
           "latency_ms": metrics.latency.median_ms if metrics.latency else None,
           "items_per_s": metrics.latency.items_per_s if metrics.latency else None,
           "build_s": case.timings.get("prepare_s")}
    return {k: float(v) for k, v in out.items() if v is not None and np.isfinite(v)}


def open_history(db: Path) -> sqlite3.Connection:
    """The history database (made if absent), its tables ensured; a corrupt or unwritable file raises."""
    db.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(db, timeout=60)
    try:
        connection.executescript(SCHEMA)
    except sqlite3.Error:
        connection.close()
        raise
    return connection


def append(db: Path, record: RunRecord) -> None:
    """Add a run record's passed and failed cases' metrics and every case's status, and whether the record holds
    the whole matrix (no shard), for :func:`unjudged` (idempotent: a run is keyed by its run_id)."""
    env = record.environment
    run_id = record.run_id or f"{record.started}|{env.host or ''}|{record.shard.index if record.shard else ''}"
    with open_history(db) as connection:
        connection.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?)",
                           (run_id, record.started, env.git_commit, env.runner_class or "unknown",
                            json.dumps(env.packages, sort_keys=True)))
        connection.executemany("INSERT OR REPLACE INTO points VALUES (?, ?, ?, ?)",
                               [(run_id, case.id, name, value) for case in record.cases
                                if case.judged for name, value in case_metrics(case).items()])
        connection.executemany("INSERT OR REPLACE INTO statuses VALUES (?, ?, ?)",
                               [(run_id, case.id, case.status) for case in record.cases])
        if not record.shard:
            connection.execute("INSERT OR REPLACE INTO whole_runs VALUES (?)", (run_id,))


@dataclass(frozen=True)
class Series:
    """One case's metric on one runner class, oldest run first."""

    runner_class: str
    case_id: str
    metric: str
    values: tuple[float, ...]
    run_ids: tuple[str, ...]
    started: tuple[str, ...]
    commits: tuple[str | None, ...]

    def last(self, n: int) -> "Series":
        return Series(self.runner_class, self.case_id, self.metric, self.values[-n:], self.run_ids[-n:],
                      self.started[-n:], self.commits[-n:])


@dataclass(frozen=True)
class SeriesVerdict:
    series: Series  # the runs judged (the policy's window): the verdict's step indexes point into it
    verdict: Verdict

    @property
    def runner_class(self) -> str:
        return self.series.runner_class

    @property
    def case_id(self) -> str:
        return self.series.case_id

    @property
    def metric(self) -> str:
        return self.series.metric

    @property
    def last_good(self) -> int | None:
        """Index of the newest run before the change this verdict is about (a step, or a suspicious last run)."""
        if self.verdict.state in ("regression", "improvement") and self.verdict.steps:
            return self.verdict.steps[-1].index - 1
        if self.verdict.state == "suspicious" and len(self.series.values) > 1:
            return len(self.series.values) - 2
        return None

    def describe(self) -> str:
        text = f"{self.verdict.state:<17} {self.case_id} {self.metric} [{self.runner_class}], " \
               f"{len(self.series.values)} runs"
        if self.verdict.steps and self.verdict.state in ("regression", "improvement"):
            commit = self.series.commits[self.verdict.steps[-1].index]
            text += f": {self.verdict.detail}" + (f", first at commit {commit[:12]}" if commit else "")
        elif self.verdict.detail:
            text += f": {self.verdict.detail}"
        return text


def utc_instant(started: object) -> str | None:
    """A record's start time (ISO 8601 with its local offset, as records write it) as a UTC instant that sorts as
    text, or None where it is none: a runner on UTC and one on New York a minute later, or a DST fall-back night,
    sorted by the local text put the later run first."""
    if not isinstance(started, str):
        return None
    try:
        moment = datetime.fromisoformat(started)
    except ValueError:
        try:
            moment = datetime.strptime(started, "%Y-%m-%dT%H:%M:%S%z")
        except ValueError:
            return None
    if moment.tzinfo is None:  # no offset (a record made by hand; the harness writes one): taken as UTC
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ordered(db: Path) -> sqlite3.Connection:
    """``db`` opened to be read in time order (``utc(started)``); a run without a start time that orders is refused,
    naming how many: its place in every series is unknown, and leaving it out hid the regressions it held."""
    connection = sqlite3.connect(db)
    connection.create_function("utc", 1, utc_instant, deterministic=True)
    unordered = connection.execute("SELECT COUNT(*) FROM runs WHERE utc(started) IS NULL").fetchone()[0]
    if unordered:
        connection.close()
        raise HarnessError(f"history {db}: {unordered} run(s) have no start time to order them by (a record's "
                           "'started'); remove those rows or rebuild the history from the records")
    return connection


def series(db: Path) -> Iterator[Series]:
    """Every series in ``db``, each in time order."""
    if not db.is_file():
        raise HarnessError(f"history database not found: {db}")
    try:
        with contextlib.closing(_ordered(db)) as connection:
            rows = connection.execute(
                "SELECT r.runner_class, p.case_id, p.metric, p.value, r.run_id, r.started, r.git_commit FROM points p "
                "JOIN runs r USING (run_id) WHERE typeof(p.value) IN ('real', 'integer') "
                "AND typeof(p.case_id) = 'text' AND typeof(p.metric) = 'text' "  # a hand-edited row is no measurement
                "ORDER BY r.runner_class, p.case_id, p.metric, utc(r.started), r.rowid").fetchall()
    except sqlite3.DatabaseError as exc:
        raise HarnessError(f"{db} is not a readable history database: {exc}") from exc
    for key, group in itertools.groupby(rows, key=lambda row: row[:3]):
        columns = list(zip(*group))
        yield Series(*key, tuple(columns[3]), tuple(columns[4]), tuple(columns[5]), tuple(columns[6]))


def run_packages(db: Path, run_ids: list[str]) -> dict[str, dict[str, str]]:
    """The package versions each run recorded."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute(f"SELECT run_id, packages FROM runs WHERE run_id IN ({','.join('?' * len(run_ids))})",
                                  run_ids).fetchall()
    found = {}
    for run_id, packages in rows:
        try:
            found[run_id] = json.loads(packages or "{}") if isinstance(packages, str) else {}
        except ValueError:  # hand-edited: no versions to show
            found[run_id] = {}
    return {run_id: value if isinstance(value, dict) else {} for run_id, value in found.items()}


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: Policy = Policy()
    kinds: dict[Literal[tuple(sorted({kind for _, kind in METRICS.values()}))], Policy]  # type: ignore[misc]


class HistoryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profiles: dict[str, Profile]


def load_policies(path: Path | None, profile: str) -> dict[str, Policy]:
    """Per metric kind, the policy of ``profile`` (premerge or nightly) in the policy file (the
    packaged one, or ``path`` in its place); a kind's thresholds over the profile's defaults."""
    document = load(path, "history.yaml", HistoryPolicy, "history policy")
    where = path or "the packaged history policy"
    if profile not in document.profiles:
        raise HarnessError(f"{where}: no profile {profile!r} (has: {', '.join(document.profiles)})")
    section = document.profiles[profile]
    policies = {kind: Policy(**{**section.defaults.model_dump(exclude_unset=True), **values.model_dump(exclude_unset=True)})
                for kind, values in section.kinds.items()}
    missing = sorted({kind for _, kind in METRICS.values()} - set(policies))
    if missing:
        raise HarnessError(f"{where}, profile {profile!r}: no thresholds for metric kind(s) {missing}")
    return policies


def judge_history(db: Path, policies: dict[str, Policy]) -> list[SeriesVerdict]:
    out = []
    for whole in series(db):
        if whole.metric not in METRICS:
            continue
        higher, kind = METRICS[whole.metric]
        policy = policies[kind]
        judged = whole.last(policy.window)
        out.append(SeriesVerdict(judged, classify(np.array(judged.values), policy, higher)))
    return out


def unjudged(db: Path) -> list[str]:
    """A line per case that its runner class judged in one run and not in the next: skipped or errored where it
    had passed or failed, or absent from a whole (unsharded) run after the whole run before it judged it. A history
    whose newest run judged less than the one before is no stable history, whatever its series say."""
    try:
        with contextlib.closing(_ordered(db)) as connection:
            tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"statuses", "whole_runs"} <= tables:  # a history written before statuses were kept
                return [UNCHECKED]
            rows = connection.execute(
                "SELECT r.runner_class, s.case_id, s.status, r.run_id, r.started, w.run_id IS NOT NULL FROM statuses s "
                "JOIN runs r USING (run_id) LEFT JOIN whole_runs w USING (run_id) "
                "ORDER BY r.runner_class, utc(r.started), r.rowid").fetchall()
    except sqlite3.DatabaseError as exc:
        raise HarnessError(f"{db} is not a readable history database: {exc}") from exc
    lines = []
    for runner, group in itertools.groupby(rows, key=lambda row: row[0]):
        runs: dict[str, dict[str, str]] = {}  # run → case → status, oldest run first
        whole: list[str] = []
        last: dict[str, tuple[str, str]] = {}  # case → (status, run) of the run before its newest
        newest: dict[str, tuple[str, str]] = {}
        for _, case, status, run, _, is_whole in group:
            runs.setdefault(run, {})[case] = status
            if is_whole and run not in whole:
                whole.append(run)
            if case in newest and newest[case][1] != run:
                last[case] = newest[case]
            newest[case] = (status, run)
        for case, (status, run) in sorted(newest.items()):
            if status not in JUDGED and case in last and last[case][0] in JUDGED:
                lines.append(f"unjudged          {case} [{runner}]: {status} in run {run}, {last[case][0]} in run "
                             f"{last[case][1]}")
        if len(whole) > 1:
            before, now = runs[whole[-2]], runs[whole[-1]]
            lines += [f"missing           {case} [{runner}]: not in run {whole[-1]}, {status} in run {whole[-2]}"
                      for case, status in sorted(before.items()) if status in JUDGED and case not in now]
    return lines
