"""One row per case, computed once: the model the terminal table, the Markdown summary and the HTML page
all render (each chooses its columns and its formatting; none re-derives a value or re-parses another)."""
from __future__ import annotations

from collections import Counter

from dataclasses import dataclass
from typing import Iterable

from quantverdict.report.load import Verdicts
from quantverdict.report.schema import CaseRecord, RunRecord


@dataclass(frozen=True)
class CaseRow:
    """A case's headline figures: its measured output's metrics, task accuracy and its change against FP32,
    the recipe's verdict and SNR on its graph's semantics, the runtime's fidelity, the 95% interval of the
    case's headline (accuracy change where labelled, else top-1 agreement), the speedup over FP32."""

    id: str
    model: str
    precision: str
    backend: str
    status: str
    message: str
    cosine: float | None
    snr_db: float | None
    top1: float | None
    accuracy: float | None
    accuracy_change: float | None  # points, negative for a loss
    recipe: str | None  # "ok" / "FAIL" for quantized cases
    recipe_snr_db: float | None
    fidelity: str | None
    flip_fraction: float | None
    interval: str | None
    speedup: float | None
    coverage: str | None  # "quantized/weighted layers" the backend ran in the precision

    @classmethod
    def of(cls, case: CaseRecord, speedup: float | None = None) -> "CaseRow":
        first, task, verdict = case.metrics.measured(), case.metrics.task, Verdicts.of(case)
        return cls(case.id, case.model, case.precision, case.backend, case.status, case.message, first.cosine,
                   first.snr_db, first.top1_agreement, task.accuracy if task else None,
                   0.0 - task.accuracy_drop_points if task else None, verdict.recipe, verdict.recipe_snr_db,
                   verdict.fidelity, verdict.flip_fraction, verdict.interval, speedup, _coverage(case))


def _coverage(case: CaseRecord) -> str | None:
    metrics = case.metrics
    coverage = metrics.coverage or (metrics.recipe.coverage if metrics.recipe else None)
    return f"{coverage.quantized}/{coverage.layers}" if coverage else None


def speedups(record: RunRecord) -> dict[str, float]:
    """Median latency of the FP32 case over each case's, per model and backend."""
    fp32 = {(c.model, c.backend): c.metrics.latency.median_ms for c in record.cases
            if c.precision == "fp32" and c.metrics.latency is not None}
    out = {}
    for case in record.cases:
        latency, base = case.metrics.latency, fp32.get((case.model, case.backend))
        if latency and base and case.precision != "fp32":
            out[case.id] = base / latency.median_ms
    return out


def rows(record: RunRecord) -> list[CaseRow]:
    """Every case of a record, in its order, with its speedup where timed."""
    found = speedups(record)
    return [CaseRow.of(case, found.get(case.id)) for case in record.cases]


def number(value: float | None, spec: str, suffix: str = "", missing: str = "–") -> str:
    return missing if value is None else f"{value:{spec}}{suffix}"


def terminal_table(cases: Iterable[CaseRow]) -> str:
    """The run command's table: one line per case judged, then the skipped ones counted by reason (a CPU runner's
    cold main job printed 286 lines, 73% of them skips for want of a GPU)."""
    header = f"{'model':<18} {'precision':<9} {'backend':<12} {'cosine':>8} {'snr_db':>7} {'top1':>6} " \
             f"{'acc':>6} {'Δacc':>6} {'recipe':>11} {'flips':>6} {'layers':>7}  {'95% interval':<22} result"
    lines = [header, "-" * len(header)]
    rows = list(cases)
    skipped = Counter(row.message for row in rows if row.status == "skipped")
    for row in (row for row in rows if row.status != "skipped"):
        recipe = f"{row.recipe} {number(row.recipe_snr_db, '.1f', missing='-').rjust(5)}" if row.recipe else "-"
        flips = f"{100 * row.flip_fraction:.2g}%" if row.flip_fraction is not None else "-"
        cells = [number(row.cosine, ".5f", missing="-").rjust(8), number(row.snr_db, ".1f", missing="-").rjust(7),
                 number(row.top1, ".3f", missing="-").rjust(6), number(row.accuracy, ".3f", missing="-").rjust(6),
                 number(row.accuracy_change, "+.2f", missing="-").rjust(6), recipe.rjust(11), flips.rjust(6),
                 (row.coverage or "-").rjust(7), (row.interval or "-").ljust(22)]
        lines.append(f"{row.model:<18} {row.precision:<9} {row.backend:<12} {' '.join(cells)} {row.status}")
    if skipped:
        lines += ["", f"skipped: {sum(skipped.values())} case(s)"]
        lines += [f"  {count} × {reason}" for reason, count in skipped.most_common()]
    return "\n".join(lines)


SUMMARY_HEADER = ("model", "precision", "backend", "cosine", "SNR dB", "Δacc (points)", "95% interval",
                  "recipe (SNR dB)", "runtime fidelity (flips)", "layers quantized", "speedup", "result")


def summary_cells(row: CaseRow) -> list[str]:
    """The Markdown summary's and the page's cells for a case (plain text; each renderer escapes its own)."""
    return [row.model, row.precision, row.backend, number(row.cosine, ".5f"), number(row.snr_db, ".1f"),
            number(row.accuracy_change, "+.2f"), row.interval or "–",
            f"{row.recipe} ({number(row.recipe_snr_db, '.1f')})" if row.recipe else "–",
            f"{row.fidelity} ({100 * row.flip_fraction:.2g}%)" if row.fidelity and row.flip_fraction is not None
            else "–", row.coverage or "–", number(row.speedup, ".2f", "×"), row.status]
