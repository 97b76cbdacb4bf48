"""The run history for people: which series changed, since which run, and what else changed then.

- *What changed since the last good run*: per flagged series (regression, improvement,
  suspicious) its last good run and the newest, both values and the change, both commits, and
  the package versions that differ between the two runs: where to start looking.
- *Trend lines*: one chart per flagged series, titled with its runner class (series never mix
  classes), the fitted levels drawn and each kept change point marked and labelled with its
  direction, size, p-value and first commit. Stable series are counted, not drawn, unless asked.
"""
from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from quantverdict.judge.changepoint import worse
from quantverdict.report.history import METRICS, SeriesVerdict, run_packages
from quantverdict.report.charts import figure

FLAGGED = ("regression", "suspicious", "improvement")
MAX_CHARTS = 60  # a page a person reads; the table lists every flagged series


def _order(verdict: SeriesVerdict) -> tuple:
    state = verdict.verdict.state
    return (FLAGGED.index(state) if state in FLAGGED else len(FLAGGED), verdict.runner_class, verdict.case_id,
            verdict.metric)


def history_section(db: Path, verdicts: Sequence[SeriesVerdict], runner_class: str | None = None,
                    draw_all: bool = False, profile: str = "nightly") -> str:
    """HTML: counts, the "what changed" table and the trend charts (``runner_class``: only its series)."""
    chosen = sorted((v for v in verdicts if runner_class is None or v.runner_class == runner_class), key=_order)
    counts = Counter(v.verdict.state for v in chosen)
    flagged = [v for v in chosen if v.verdict.state in FLAGGED]
    drawn = (chosen if draw_all else flagged)[:MAX_CHARTS]
    scope = f"runner class {runner_class}" if runner_class else "every runner class"
    parts = [f"<h2>History: change points per series ({html.escape(scope)})</h2>",
             f"<p>{len(chosen)} series judged under the {html.escape(profile)} policy: "
             + ", ".join(f"{n} {html.escape(state)}" for state, n in sorted(counts.items())) + ".</p>",
             _changes_table(db, flagged)]
    if drawn:
        parts.append('<div class="charts">' + "".join(
            f'<img alt="trend {html.escape(v.case_id)} {html.escape(v.metric)}" '
            f'src="data:image/png;base64,{_trend_chart(v)}">' for v in drawn) + "</div>")
    left = len(chosen if draw_all else flagged) - len(drawn)
    if left > 0:
        parts.append(f'<p class="legend">{left} more series not drawn (the table lists every flagged one).</p>')
    if not draw_all and counts.get("stable"):
        parts.append(f'<p class="legend">{counts["stable"]} stable series not drawn.</p>')
    return "".join(parts)


def _changes_table(db: Path, flagged: list[SeriesVerdict]) -> str:
    if not flagged:
        return "<h3>What changed since the last good run</h3><p>Nothing: no series has a regression, " \
               "an improvement or a suspicious last run.</p>"
    runs = [v.series.run_ids[i] for v in flagged for i in (v.last_good, -1) if i is not None]
    packages = run_packages(db, sorted(set(runs)))
    head = ("state", "case", "metric", "runner class", "last good run", "value", "newest run", "value", "change",
            "packages changed")
    rows = []
    for v in flagged:
        good, series = v.last_good, v.series
        if good is None:
            continue
        before, now = series.values[good], series.values[-1]
        cells = [v.verdict.state, v.case_id, v.metric, v.runner_class, _run_cell(series, good), f"{before:.5g}",
                 _run_cell(series, -1), f"{now:.5g}", _change(before, now),
                 package_diff(packages.get(series.run_ids[good], {}), packages.get(series.run_ids[-1], {}))]
        cls = {"regression": "bad", "suspicious": "thin", "improvement": "ok"}[v.verdict.state]
        rows.append(f'<tr class="{cls}">' + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return ("<h3>What changed since the last good run</h3>"
            '<p class="legend">Last good run: the newest run before the step (or, for a suspicious series, before '
            "its last run). Packages: versions that differ between that run and the newest.</p>"
            "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")


def _change(before: float, after: float) -> str:
    """Relative where the level is not zero, else absolute."""
    return f"{100 * (after - before) / abs(before):+.1f}%" if before else f"{after - before:+.4g}"


def _run_cell(series: Any, index: int) -> str:
    commit = series.commits[index]
    return f"{series.started[index][:16]} ({commit[:10] if commit else 'no commit'})"


def package_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """The package versions that differ between two runs, or 'none'."""
    changed = [f"{name} {before.get(name, '–')}→{after.get(name, '–')}" for name in sorted({*before, *after})
               if before.get(name) != after.get(name)]
    return ", ".join(changed) or "none"


def _trend_chart(verdict: SeriesVerdict) -> str:
    series, result = verdict.series, verdict.verdict
    values = np.asarray(series.values)
    higher, _ = METRICS[series.metric]

    def draw(ax: Any) -> bool:
        x = np.arange(values.size)
        ax.plot(x, values, marker="o", markersize=3, color="#2e86c1", linewidth=1)
        low, high = float(values.min()), float(values.max())
        ax.set_ylim(low - 0.1 * (high - low or 1), high + 0.5 * (high - low or 1))  # headroom for the labels
        bounds = [0, *(s.index for s in result.steps), values.size]
        for start, end in zip(bounds[:-1], bounds[1:]):
            ax.hlines(values[start:end].mean(), start - 0.4, end - 0.6, color="#555", linewidth=1.5)
        for step in result.steps:
            down = worse(step.before, step.after, higher)
            color = "#c0392b" if down else "#27ae60"
            ax.axvline(step.index - 0.5, color=color, linestyle="--", linewidth=1)
            commit = series.commits[step.index]
            ax.annotate(f"{'worse' if down else 'better'} {_change(step.before, step.after)} (p={step.p_value:.2g})"
                        + (f"\n{commit[:10]}" if commit else ""), (step.index - 0.5, 1.0),
                        xycoords=("data", "axes fraction"), fontsize=7, color=color, va="top", ha="left",
                        xytext=(3, -2), textcoords="offset points",
                        bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1})
        if result.state == "suspicious":
            ax.plot([values.size - 1], [values[-1]], marker="o", color="#e67e22", markersize=8, fillstyle="none")
        ticks = np.unique(np.linspace(0, values.size - 1, min(6, values.size)).astype(int))
        ax.set_xticks(ticks, [series.started[i][:10] for i in ticks], fontsize=7)
        ax.set_ylabel(series.metric, fontsize=8)
        ax.set_title(f"{result.state}: {series.case_id} {series.metric}\n[{series.runner_class}]", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        return True

    return figure(draw, width=6.2, height=2.6) or ""
