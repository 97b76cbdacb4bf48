"""The run record: one JSON document per run, with a versioned schema.

It holds the environment (host, GPU, package versions) and one entry per case
(:meth:`quantverdict.run.pipeline.CaseResult.to_dict`), so that reports and release gates can be
computed later from the file alone.
"""
from __future__ import annotations

import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from quantverdict.cache import atomic_write_bytes
from quantverdict.capabilities import Capabilities
from quantverdict.errors import HarnessError
from quantverdict.report.schema import SCHEMA_VERSION
HISTORY_DB = "history.sqlite"  # beside the records: every run is appended (quantverdict.report.history)


def build_record(cases: Iterable[dict[str, Any]], caps: Capabilities, started: float,
                 cache_stats: dict[str, int] | None = None, shard: dict[str, int] | None = None) -> dict[str, Any]:
    cases = list(cases)
    extra = {"shard": shard} if shard else {}
    return {
        **extra,
        "schema_version": SCHEMA_VERSION,
        "run_id": uuid.uuid4().hex,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 3),
        "command": sys.argv,
        "environment": {**caps.to_dict(), **_toolchain(), "python": platform.python_version(),
                        "platform": platform.platform()},
        "summary": summarize(cases),
        "cache": dict(cache_stats or {}),
        "cases": cases,
    }


def summarize(cases: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many cases ended in each status."""
    return dict(Counter(case["status"] for case in cases))


def _toolchain() -> dict[str, str | None]:
    """CUDA and driver versions and the git commit of the working directory, where available."""
    def output(*command: str) -> str | None:
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    cuda = None
    if caps_torch := sys.modules.get("torch"):
        cuda = getattr(caps_torch.version, "cuda", None)
    driver = output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    return {"cuda": cuda, "driver": driver.splitlines()[0] if driver else None,
            "git_commit": output("git", "rev-parse", "HEAD")}


class DestinationError(HarnessError):
    """A report folder or history database that cannot be written, named."""


def history_path(report_dir: Path, history: Path | None) -> Path:
    return history or report_dir / HISTORY_DB


def check_writable(folder: Path, what: str) -> None:
    """``folder`` exists (made if need be) and takes a file, or a :class:`DestinationError` naming it and ``what``
    was to go there: found before the work, not after it."""
    if folder.exists() and not folder.is_dir():
        raise DestinationError(f"cannot write {what} to {folder}: it is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise DestinationError(f"cannot write {what} to {folder}: {exc.strerror or exc}") from None


def check_destinations(report_dir: Path, history: Path | None = None, cache_dir: Path | None = None) -> None:
    """Before a run: the record's folder, the history database and the cache can be written, so that a read-only
    folder or a corrupt history is found before the matrix runs (one line), not by every case after it."""
    check_writable(report_dir, "run records")
    if cache_dir is not None:
        check_writable(cache_dir, "the cache (exports, calibrations, engines)")
    from quantverdict.report.history import open_history

    db = history_path(report_dir, history)
    try:
        open_history(db).close()
    except (sqlite3.Error, OSError) as exc:
        advice = "another process holds it: run again when it is done" if "locked" in str(exc) else \
            "move it aside to start a new one"
        raise DestinationError(f"cannot use the run history {db}: {exc} ({advice})") from None


def write_record(record: dict[str, Any], report_dir: Path) -> Path:
    """Write atomically to ``report_dir/run-<time>-<pid>-<id>.json`` and return the path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = report_dir / f"run-{stamp}-{os.getpid()}-{record.get('run_id', '')[:8]}.json"
    try:
        atomic_write_bytes(path, json.dumps(record, indent=1, default=str).encode())
    except OSError as exc:
        raise DestinationError(f"cannot write the run record {path}: {exc.strerror or exc}") from None
    return path


def record_run(record: dict[str, Any], report_dir: Path, history: Path | None = None) -> tuple[Path, str | None]:
    """Write the record, then append it to the run history; (its path, why the history was not updated,
    or None). The record is written first: a history that fails never loses it."""
    path = write_record(record, report_dir)
    from quantverdict.report.history import append
    from quantverdict.report.load import RecordError, load_record

    db = history_path(report_dir, history)
    try:
        append(db, load_record(path))  # the record as every reader reads it
    except (sqlite3.Error, OSError, RecordError) as exc:
        return path, f"the run was not added to the history {db} ({exc}); its record is {path}"
    return path, None
