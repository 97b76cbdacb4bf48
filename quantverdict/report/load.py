"""Reading run records back, with every problem named (the gate exits 2 on these)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantverdict.documents import error_lines
from quantverdict.errors import HarnessError
from quantverdict.report.schema import SCHEMA_VERSION, CaseRecord, RunRecord

MAX_RECORD_BYTES = 4 << 30  # a record of 100,000 cases is ~400 MB


class RecordError(HarnessError):
    """A run record that is missing, unreadable, or not of this schema (the gate's exit code 2)."""


def load_record(path: Path) -> RunRecord:
    """A run record, read as :mod:`quantverdict.report.schema`'s types: every problem is a :class:`RecordError` naming
    the file and the field's path, never a traceback later."""
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
    return check_record(record, str(path))


def check_record(record: dict[str, Any], where: str) -> RunRecord:
    """``record`` as the schema's types, or :class:`RecordError` with a line per problem (the first 20); cases are
    read one at a time, each dict let go as its type is made, so a record of 100,000 cases is never held twice."""
    from pydantic import ValidationError

    problems: list[str] = []
    cases = record.get("cases")
    try:
        run = RunRecord.model_validate({**record, "cases": []})
    except ValidationError as exc:
        problems += error_lines(exc.errors(), RunRecord, record, where)
    typed: list[CaseRecord] = []
    if isinstance(cases, list):
        for index, case in enumerate(cases):
            try:
                typed.append(CaseRecord.model_validate(case))
            except ValidationError as exc:
                errors = [{**error, "loc": ("cases", index, *error["loc"])} for error in exc.errors()]
                problems += error_lines(errors, RunRecord, record, where, _case_name)
            if len(problems) >= 20:
                break
    elif "cases" in record:
        problems.append(f"{where}: cases: Input should be a valid list")
    if problems:
        raise RecordError("\n".join(problems))
    run.cases = typed
    return run


def _case_name(record: Any, loc: tuple[Any, ...]) -> str:
    case = record["cases"][loc[1]] if len(loc) > 1 and isinstance(loc[1], int) else None
    return f"case {case['id']!r}" if isinstance(case, dict) and isinstance(case.get("id"), str) else ""


def history(directory: Path) -> list[RunRecord]:
    """Every readable record under ``directory`` (recursively), oldest first; others are skipped."""
    records = []
    for path in sorted(directory.rglob("run-*.json")):
        try:
            records.append(load_record(path))
        except RecordError:
            continue
    return sorted(records, key=lambda r: r.started)


def case_margin(case: CaseRecord) -> float | None:
    """How much of the tolerance budget is left: 1 = exact, 0 = at the bound, < 0 = failed.

    For a "≥ bound" metric whose ideal is 1 (cosine, top-1) the budget is 1 − bound; for a
    "≤ bound" metric it is the bound itself. The case's margin is its smallest.
    """
    margins = []
    for check in case.metrics.checks:
        if check.higher_is_better:
            budget, used = 1.0 - check.bound, 1.0 - check.observed
        else:
            budget, used = check.bound, check.observed
        if budget > 0:
            margins.append(1.0 - used / budget)
        elif not check.passed:
            margins.append(-1.0)
    if not margins:
        return None
    return min(margins)


@dataclass(frozen=True)
class Verdicts:
    """The recipe and runtime-fidelity verdicts of a quantized case, and the case's headline confidence interval
    (accuracy drop where labelled, else top-1 agreement), for tables."""

    recipe: str | None = None  # "ok" / "FAIL"
    recipe_snr_db: float | None = None
    fidelity: str | None = None
    flip_fraction: float | None = None
    interval: str | None = None

    @classmethod
    def of(cls, case: CaseRecord) -> "Verdicts":
        metrics = case.metrics
        recipe, fidelity = metrics.recipe, metrics.fidelity
        verdict, snr, agreement = None, None, None
        if recipe is not None:
            verdict, snr = "ok" if recipe.passed else "FAIL", recipe.measured().snr_db
        runtime = flips = None
        if fidelity is not None and fidelity.outputs:
            runtime = "ok" if fidelity.passed else "FAIL"
            flips = max(output.flip_fraction for output in fidelity.outputs)
        drop = metrics.task.intervals.get("accuracy_drop_points") if metrics.task else None
        top1 = metrics.measured().intervals.get("top1_agreement")
        if drop:
            agreement = f"Δacc [{-drop.high:+.2f}, {-drop.low:+.2f}]"
        elif top1:
            agreement = f"top1 [{top1.low:.2f}, {top1.high:.2f}]"
        return cls(verdict, snr, runtime, flips, agreement)
