"""Reading run records back, with every problem named (the gate exits 2 on these)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantverdict.documents import error_lines
from quantverdict.errors import HarnessError
from quantverdict.report.schema import SCHEMA_VERSION, CaseRecord, RunRecord

MAX_RECORD_BYTES = 4 << 30  # a record of 100,000 cases is ~400 MB


class RecordError(HarnessError):
    """A run record that is missing, unreadable, or not of this schema (the gate's exit code 2)."""


def load_record(path: Path) -> dict[str, Any]:
    """A run record as a dict, checked against :mod:`quantverdict.report.schema`: every problem is a
    :class:`RecordError` naming the file and the field's path, never a traceback later."""
    try:
        if not path.resolve().is_file():  # a FIFO would block the reader, /dev/zero has no size to check
            raise RecordError(f"run record {path} is not a regular file") if path.exists() else FileNotFoundError
        size = path.resolve().stat().st_size
        if size > MAX_RECORD_BYTES:
            raise RecordError(f"run record {path} is {size:,} bytes; the limit is {MAX_RECORD_BYTES:,}")
        record = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise RecordError(f"run record not found: {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: JSON, or an integer of 5,000 digits
        raise RecordError(f"run record {path} is not valid JSON: {exc}") from exc
    except RecursionError:
        raise RecordError(f"run record {path} nests too deeply to be a run record") from None
    if not isinstance(record, dict) or "schema_version" not in record:
        raise RecordError(f"{path} is not a run record (no schema_version)")
    if record["schema_version"] != SCHEMA_VERSION:
        raise RecordError(f"{path} has schema_version {record['schema_version']!r}; "
                          f"this harness reads schema_version {SCHEMA_VERSION}")
    check_record(record, str(path))
    return record


def check_record(record: dict[str, Any], where: str) -> None:
    """Raise :class:`RecordError` unless ``record`` has the schema's shape; cases are checked one at a time,
    so a record of 100,000 cases is never held twice."""
    from pydantic import ValidationError

    problems: list[str] = []
    try:
        RunRecord.model_validate({**record, "cases": []})
    except ValidationError as exc:
        problems += error_lines(exc.errors(), RunRecord, record, where)
    cases = record.get("cases")
    if isinstance(cases, list):
        for index, case in enumerate(cases):
            try:
                CaseRecord.model_validate(case)
            except ValidationError as exc:
                errors = [{**error, "loc": ("cases", index, *error["loc"])} for error in exc.errors()]
                problems += error_lines(errors, RunRecord, record, where, _case_name)
            if len(problems) >= 20:
                break
    elif "cases" in record:
        problems.append(f"{where}: cases: Input should be a valid list")
    if problems:
        raise RecordError("\n".join(problems))


def _case_name(record: Any, loc: tuple[Any, ...]) -> str:
    case = record["cases"][loc[1]] if len(loc) > 1 and isinstance(loc[1], int) else None
    return f"case {case['id']!r}" if isinstance(case, dict) and isinstance(case.get("id"), str) else ""


def history(directory: Path) -> list[dict[str, Any]]:
    """Every readable record under ``directory`` (recursively), oldest first; others are skipped."""
    records = []
    for path in sorted(directory.rglob("run-*.json")):
        try:
            records.append(load_record(path))
        except RecordError:
            continue
    return sorted(records, key=lambda r: r.get("started", ""))


def case_margin(case: dict[str, Any]) -> float | None:
    """How much of the tolerance budget is left: 1 = exact, 0 = at the bound, < 0 = failed.

    For a "≥ bound" metric whose ideal is 1 (cosine, top-1) the budget is 1 − bound; for a
    "≤ bound" metric it is the bound itself. The case's margin is its smallest.
    """
    margins = []
    for check in case.get("metrics", {}).get("checks", []):
        bound, observed = check["bound"], check["observed"]
        if check["higher_is_better"]:
            budget, used = 1.0 - bound, 1.0 - observed
        else:
            budget, used = bound, observed
        if budget > 0:
            margins.append(1.0 - used / budget)
        elif not check["passed"]:
            margins.append(-1.0)
    if not margins:
        return None
    return min(margins)


def primary_metrics(case: dict[str, Any]) -> dict[str, Any]:
    """The metrics of the case's first output, those the record leaves null left out (a reader compares numbers)."""
    first = next(iter((case.get("metrics") or {}).get("metrics", {}).values()), {})
    return {name: value for name, value in first.items() if value is not None}


def verdicts(case: dict[str, Any]) -> dict[str, Any]:
    """The recipe and runtime-fidelity verdicts of a quantized case, and the case's headline
    confidence interval (accuracy drop where labelled, else top-1 agreement), for tables."""
    metrics = case.get("metrics", {})
    recipe, fidelity = metrics.get("recipe"), metrics.get("fidelity")
    out: dict[str, Any] = {"recipe": None, "recipe_snr_db": None, "fidelity": None, "flip_fraction": None,
                           "interval": None}
    if recipe:
        out["recipe"] = "ok" if recipe.get("passed") else "FAIL"
        out["recipe_snr_db"] = primary_metrics({"metrics": recipe}).get("snr_db")
    if fidelity and fidelity.get("outputs"):
        out["fidelity"] = "ok" if fidelity.get("passed") else "FAIL"
        out["flip_fraction"] = max(o["flip_fraction"] for o in fidelity["outputs"])
    task, intervals = metrics.get("task"), primary_metrics(case).get("intervals", {})
    drop = ((task or {}).get("intervals") or {}).get("accuracy_drop_points")
    if drop:
        out["interval"] = f"Δacc [{-drop['high']:+.2f}, {-drop['low']:+.2f}]"
    elif "top1_agreement" in intervals:
        out["interval"] = f"top1 [{intervals['top1_agreement']['low']:.2f}, {intervals['top1_agreement']['high']:.2f}]"
    return out
