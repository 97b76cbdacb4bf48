"""The page's charts: matplotlib figures as base64 PNGs, each of a run record's cases (or a history of records),
at most :data:`MAX_BARS` labelled bars a chart."""
from __future__ import annotations

import base64
import io
from collections import defaultdict
from typing import Any, Callable

import numpy as np

from quantverdict.judge.compare import HISTOGRAM_EDGES
from quantverdict.precision import known_precisions, precision_rank
from quantverdict.report.rows import speedups
from quantverdict.report.schema import CaseRecord, RunRecord


def figure(draw: Callable[[Any], bool], width: float = 11, height: float = 4) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"text.parse_math": False}):  # a record's text ('$' in a case id) is text, not TeX
        fig, ax = plt.subplots(figsize=(width, height))
        try:
            if not draw(ax):
                return None
            fig.tight_layout()
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=90)
            return base64.b64encode(buffer.getvalue()).decode()
        finally:
            plt.close(fig)


def _ran(record: RunRecord) -> list[CaseRecord]:
    return [c for c in record.cases if c.judged and c.precision != "fp32"]


MAX_BARS = 60  # a chart with a labelled bar per case stays readable (and drawable) up to about this many


def most_telling(cases: list[Any], key: Callable[[Any], float]) -> tuple[list[Any], str]:
    """At most :data:`MAX_BARS` of ``cases``, lowest ``key`` first, in their run order; and the words to add to
    the axis label when some were left out."""
    if len(cases) <= MAX_BARS:
        return cases, ""
    kept = {id(c) for c in sorted(cases, key=key)[:MAX_BARS]}
    return [c for c in cases if id(c) in kept], f" ({MAX_BARS} lowest of {len(cases)})"


FEW_BARS = 12  # up to this many bars, labels are set at a readable size, slanted; more, upright and small


def _label_bars(ax: Any, labels: list[str]) -> None:
    """A bar per case, labelled by case id: readable for one case (a lone 6-point label was not) and for sixty."""
    if len(labels) <= FEW_BARS:
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=9)
        room = max(0.0, (FEW_BARS - len(labels)) / 4)  # a lone bar is not a wall across the chart
        ax.set_xlim(-0.5 - room, len(labels) - 0.5 + room)
    else:
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)


def plot_snr(record: RunRecord) -> str | None:
    snr = {id(c): c.metrics.measured().snr_db for c in _ran(record)}
    cases, note = most_telling([c for c in _ran(record) if snr[id(c)] is not None and np.isfinite(snr[id(c)])],
                                lambda c: snr[id(c)])

    def draw(ax: Any) -> bool:
        if not cases:
            return False
        colors = ["#c0392b" if c.status != "passed" else "#2e86c1" for c in cases]
        ax.bar(range(len(cases)), [snr[id(c)] for c in cases], color=colors)
        _label_bars(ax, [c.id for c in cases])
        ax.set_ylabel(f"SNR vs FP32 (dB){note}")
        return True

    return figure(draw, height=5)


def plot_accuracy_delta(record: RunRecord) -> str | None:
    tasks = {c.id: c.metrics.task for c in record.cases if c.metrics.task and c.precision != "fp32"}
    cases, note = most_telling(list(tasks), lambda case_id: -tasks[case_id].accuracy_drop_points)

    def draw(ax: Any) -> bool:
        if not cases:
            return False
        deltas = [0.0 - tasks[case_id].accuracy_drop_points for case_id in cases]
        ax.bar(range(len(cases)), deltas, color=["#c0392b" if d < 0 else "#27ae60" for d in deltas])
        spans = [tasks[case_id].intervals.get("accuracy_drop_points") for case_id in cases]
        if all(spans):  # 95% interval of the change: −high … −low of the drop's
            errors = [[max(0.0, d - (-s.high)) for d, s in zip(deltas, spans) if s],
                      [max(0.0, -s.low - d) for d, s in zip(deltas, spans) if s]]
            ax.errorbar(range(len(cases)), deltas, yerr=errors, fmt="none", ecolor="black", capsize=3,
                        label="95% interval")
            ax.legend(fontsize=7)
        ax.axhline(0, color="black", linewidth=0.8)
        _label_bars(ax, cases)
        ax.set_ylabel(f"accuracy change (points){note}")
        return True

    return figure(draw)


def plot_speedup(record: RunRecord) -> str | None:
    found = speedups(record)
    names, note = most_telling(list(found), lambda name: found[name])

    def draw(ax: Any) -> bool:
        if not found:
            return False
        ax.bar(range(len(names)), [found[n] for n in names], color="#8e44ad")
        ax.axhline(1.0, color="black", linewidth=0.8)
        _label_bars(ax, names)
        ax.set_ylabel(f"× FP32 throughput (median latency ratio){note}")
        return True

    return figure(draw, height=5)


def _powers_of_ten(value: float, position: int | None = None) -> str:
    return f"1e{round(float(np.log10(value)))}" if value > 0 else ""


def _no_label(value: float, position: int | None = None) -> str:
    return ""


def plot_histograms(record: RunRecord) -> str | None:
    totals: dict[str, np.ndarray] = {}
    for case in _ran(record):
        hist = case.metrics.measured().error_histogram
        if hist and len(hist) == len(HISTOGRAM_EDGES) - 1:  # a histogram of other bins is no histogram of these
            totals[case.precision] = totals.get(case.precision, 0) + np.asarray(hist, dtype=float)

    def draw(ax: Any) -> bool:
        if not totals:
            return False
        upper = np.r_[HISTOGRAM_EDGES[1:-1], 10.0]  # the last bin, errors ≥ max |reference|, drawn at 10
        for precision in sorted(totals, key=precision_rank):
            counts = totals[precision]
            ax.plot(upper, counts / counts.sum(), marker="o", label=precision)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_powers_of_ten)  # plain text: mathtext's labels showed as raw $\mathdefault{…}$
        ax.xaxis.set_minor_formatter(_no_label)
        ax.set_xlabel("|error| / max |reference| (upper bin edge)")
        ax.set_ylabel("fraction of elements")
        ax.legend()
        return True

    return figure(draw)


def plot_trend(records: list[RunRecord]) -> str | None:
    def draw(ax: Any) -> bool:
        if len(records) < 2:
            return False
        per_precision: dict[str, list[float]] = defaultdict(list)
        for record in records:
            by_precision = defaultdict(list)
            for case in _ran(record):
                snr = case.metrics.measured().snr_db
                if snr is not None and np.isfinite(snr):
                    by_precision[case.precision].append(snr)
            for precision in known_precisions()[1:]:
                per_precision[precision].append(float(np.mean(by_precision[precision])) if by_precision[precision] else np.nan)
        for precision, values in per_precision.items():
            if not np.all(np.isnan(values)):
                ax.plot(range(len(records)), values, marker="o", label=precision)
        ax.set_xticks(range(len(records)), [r.started[:16] for r in records], rotation=30, fontsize=7)
        ax.set_ylabel("mean SNR vs FP32 (dB)")
        ax.legend()
        return True

    return figure(draw)
