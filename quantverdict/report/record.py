"""The run record: one JSON document per run, with a versioned schema.

It holds the environment (host, GPU, package versions) and one entry per case
(:meth:`quantverdict.run.pipeline.CaseResult.to_dict`), so that reports and release gates can be
computed later from the file alone.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from quantverdict.cache import atomic_write_bytes
from quantverdict.capabilities import Capabilities

SCHEMA_VERSION = 1
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


def write_record(record: dict[str, Any], report_dir: Path, history: Path | None = None) -> Path:
    """Write atomically to ``report_dir/run-<time>-<pid>.json``, append it to the run history
    (``history``, default ``report_dir/history.sqlite``) and return the path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = report_dir / f"run-{stamp}-{os.getpid()}-{record.get('run_id', '')[:8]}.json"
    atomic_write_bytes(path, json.dumps(record, indent=1, default=str).encode())
    from quantverdict.report.history import append

    append(history or report_dir / HISTORY_DB, record)
    return path
