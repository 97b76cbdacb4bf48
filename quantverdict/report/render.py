"""A run record rendered for people: a Markdown summary (CI logs, pull requests) and a
self-contained HTML page with the accuracy matrix and charts (matplotlib PNGs, base64-embedded).
"""
from __future__ import annotations

import base64
import html
import io
import re
from collections import Counter, defaultdict
from typing import Any, Callable, Sequence

import numpy as np

from quantverdict.judge.compare import HISTOGRAM_EDGES
from quantverdict.precision import known_precisions, precision_rank
from quantverdict.report.load import case_margin, primary_metrics
from quantverdict.report.rows import SUMMARY_HEADER, number, rows, speedups, summary_cells


def markdown(record: dict[str, Any]) -> str:
    env = record["environment"]
    gpu = env.get("gpu") or {}
    summary = ", ".join(f"{n} {status}" for status, n in sorted(record["summary"].items()))
    lines = [f"# Accuracy run {record['started']}", "",
             f"{summary} in {record['duration_s']:.0f} s on {env.get('host', '?')} "
             f"({gpu.get('name', 'no GPU')}{', compute capability ' + gpu['compute_capability'] if gpu else ''})", "",
             "| " + " | ".join(SUMMARY_HEADER) + " |", "|" + " --- |" * len(SUMMARY_HEADER)]
    for row in rows(record):
        if row.status != "skipped":
            cells = [_cell(cell) for cell in summary_cells(row)]
            cells[-1] = f"**{cells[-1]}**" if row.status != "passed" else cells[-1]
            lines.append("| " + " | ".join(cells) + " |")
    failures = [c for c in record["cases"] if c["status"] in ("failed", "error")]
    if failures:
        lines += ["", "## Failures", ""] + [f"- {_cell(c['id'])}: {_cell((c['message'] or '-').splitlines()[-1])}"
                                           for c in failures]
    notes = {f"{c['model']} {c['precision']}": search["note"] for c in record["cases"]
             if (search := ((c.get("metrics") or {}).get("recipe") or {}).get("search") or {}).get("note")}
    if notes:  # what the case's bounds would take where a searched recipe misses them
        lines += ["", "## Recipe searches", ""] + [f"- {_cell(case)}: {_cell(note)}" for case, note in notes.items()]
    reasons = Counter(c["message"] for c in record["cases"] if c["status"] == "skipped")
    if reasons:
        lines += ["", "## Skipped", ""] + [f"- {n} × {_cell(reason)}" for reason, n in reasons.most_common()]
    return "\n".join(lines) + "\n"


MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def _cell(text: str) -> str:
    """Text from a record as one Markdown table cell or list item, read as text: one line, Markdown's punctuation
    backslash-escaped (no emphasis, link, code span or column from a case id or a message), angle brackets as
    entities (no HTML)."""
    escaped = MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))
    return escaped.replace("<", "&lt;").replace(">", "&gt;")


STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse}"
         "td,th{border:1px solid #999;padding:3px 6px;font-size:12px;text-align:center}"
         ".ok{background:#8fd18f}.thin{background:#f5d76e}.bad{background:#f08080}.skip{background:#ddd}"
         "img{max-width:100%}.legend,.empty{color:#555}.charts{display:flex;flex-wrap:wrap;gap:8px}"
         ".charts img{width:560px}")


def page(title: str, body: list[str]) -> str:
    """A self-contained HTML page (styles inline, charts embedded)."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")


def html_page(record: dict[str, Any], history: list[dict[str, Any]], sections: Sequence[str] = ()) -> str:
    """The run's page; ``sections``: more HTML at its end (the history's verdicts and trends)."""
    charts = [("Output accuracy per case", _plot_snr(record)),
              ("Task-accuracy change vs FP32", _plot_accuracy_delta(record)),
              ("Speedup over FP32 (same model and backend)", _plot_speedup(record)),
              ("Error histograms per precision", _plot_histograms(record)),
              ("Trend over the history of runs", _plot_trend([*history, record]))]
    body = [f"<h1>Accuracy run {html.escape(record['started'])}</h1>",
            f"<p>{html.escape(markdown(record).splitlines()[2])}</p>",
            f"<p>Runner class: {html.escape(str(record['environment'].get('runner_class', 'unknown')))}</p>",
            "<h2>Accuracy matrix</h2>", _matrix(record),
            '<p class="legend">Cell colour: margin to the tolerance (green: over half the budget left; '
            "amber: less; red: failed; grey: skipped). Text: SNR in dB against the FP32 reference.</p>"]
    notes = {"Speedup over FP32 (same model and backend)":
             "On a CPU, FP16/BF16 are storage-rounding emulations and FP8/FP4 fake-quantization: their timings "
             "measure the emulation, not the format. INT8 runs integer kernels; its flavour here is TensorRT's "
             "(signed activations), which ONNX Runtime's CPU kernels run slower than FP32."}
    for title, png in charts:
        body.append(f'<h2>{html.escape(title)}</h2>')
        if title in notes:
            body.append(f'<p class="legend">{html.escape(notes[title])}</p>')
        body.append(f'<img alt="{html.escape(title)}" src="data:image/png;base64,{png}">' if png else
                    '<p class="empty">No data in this run for this chart.</p>')
    body += [_verdicts(record), _failures(record), _skips(record), *sections]
    return page("Accuracy run", body)


def _matrix(record: dict[str, Any]) -> str:
    every = sorted({(c["precision"], c["backend"]) for c in record["cases"]},
                   key=lambda pb: (precision_rank(pb[0]), pb[1]))
    ran = {(c["precision"], c["backend"]) for c in record["cases"] if c["status"] != "skipped"}
    columns = [pb for pb in every if pb in ran]
    hidden = [f"{p} on {b}" for p, b in every if (p, b) not in ran]
    models = list(dict.fromkeys(c["model"] for c in record["cases"]))
    cells = {(c["model"], c["precision"], c["backend"]): c for c in record["cases"]}
    head = "".join(f"<th>{html.escape(p)}<br>{html.escape(b)}</th>" for p, b in columns)
    rows = []
    for model in models:
        tds = []
        for precision, backend in columns:
            case = cells.get((model, precision, backend))
            if case is None:
                tds.append("<td></td>")
                continue
            margin = case_margin(case)
            cls = {"skipped": "skip"}.get(case["status"]) or (
                "bad" if case["status"] != "passed" else "ok" if margin is None or margin > 0.5 else "thin")
            snr = primary_metrics(case).get("snr_db")
            text = "skip" if case["status"] == "skipped" else ("∞" if snr == float("inf") else number(snr, ".0f"))
            title = html.escape(case.get("message") or f"margin {margin:.2f}" if margin is not None else case["status"])
            tds.append(f'<td class="{cls}" title="{title}">{text}</td>')
        rows.append(f"<tr><th>{html.escape(model)}</th>{''.join(tds)}</tr>")
    note = (f'<p class="legend">Every case skipped, so not shown (reasons under Skipped cases): '
            f'{html.escape(", ".join(hidden))}.</p>' if hidden else "")
    return f'<table class="matrix"><tr><th>model</th>{head}</tr>{"".join(rows)}</table>{note}'


def _verdicts(record: dict[str, Any]) -> str:
    """The summary's per-case table (intervals, recipe and runtime verdicts), from the same rows as the Markdown."""
    cases = [row for row in rows(record) if row.status != "skipped"]
    if not cases:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in SUMMARY_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in summary_cells(row)) + "</tr>" for row in cases)
    return ("<h2>Cases: confidence intervals, recipe and runtime verdicts</h2>"
            '<p class="legend">Recipe: the precision graph evaluated as written (Q/DQ semantics, the same on every '
            "CPU) against FP32. Runtime fidelity: the runtime's outputs against those semantics, as the fraction "
            "of rounding decisions that would have to flip to explain the difference.</p>"
            f"<table><tr>{head}</tr>{body}</table>")


def _failures(record: dict[str, Any]) -> str:
    failures = [c for c in record["cases"] if c["status"] in ("failed", "error")]
    if not failures:
        return "<h2>Failures</h2><p>None.</p>"
    items = []
    for case in failures:
        divergence = case.get("metrics", {}).get("first_divergence")
        where = (f"<br>first diverging layer: <code>{html.escape(str(divergence.get('node')))}</code> "
                 f"({html.escape(str(divergence.get('op')))}), {html.escape(str(divergence.get('summary', '')))}"
                 if divergence else "")
        items.append(f"<li><b>{html.escape(case['id'])}</b><pre>{html.escape(case['message'])}</pre>{where}</li>")
    return f"<h2>Failures</h2><ul>{''.join(items)}</ul>"


def _skips(record: dict[str, Any]) -> str:
    reasons = Counter(c["message"] for c in record["cases"] if c["status"] == "skipped")
    rows = "".join(f"<tr><td>{n}</td><td style='text-align:left'>{html.escape(r)}</td></tr>"
                   for r, n in reasons.most_common())
    return f"<h2>Skipped cases</h2><table><tr><th>cases</th><th>reason</th></tr>{rows}</table>" if rows else ""


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


def _ran(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in record["cases"] if c["status"] in ("passed", "failed") and c["precision"] != "fp32"]


MAX_BARS = 60  # a chart with a labelled bar per case stays readable (and drawable) up to about this many


def _most_telling(cases: list[Any], key: Callable[[Any], float]) -> tuple[list[Any], str]:
    """At most :data:`MAX_BARS` of ``cases``, lowest ``key`` first, in their run order; and the words to add to
    the axis label when some were left out."""
    if len(cases) <= MAX_BARS:
        return cases, ""
    kept = {id(c) for c in sorted(cases, key=key)[:MAX_BARS]}
    return [c for c in cases if id(c) in kept], f" ({MAX_BARS} lowest of {len(cases)})"


def _plot_snr(record: dict[str, Any]) -> str | None:
    cases, note = _most_telling([c for c in _ran(record) if np.isfinite(primary_metrics(c).get("snr_db", np.inf))],
                                lambda c: primary_metrics(c)["snr_db"])

    def draw(ax: Any) -> bool:
        if not cases:
            return False
        colors = ["#c0392b" if c["status"] != "passed" else "#2e86c1" for c in cases]
        ax.bar(range(len(cases)), [primary_metrics(c)["snr_db"] for c in cases], color=colors)
        ax.set_xticks(range(len(cases)), [c["id"] for c in cases], rotation=90, fontsize=6)
        ax.set_ylabel(f"SNR vs FP32 (dB){note}")
        return True

    return figure(draw, height=5)


def _plot_accuracy_delta(record: dict[str, Any]) -> str | None:
    cases, note = _most_telling([c for c in record["cases"] if c.get("metrics", {}).get("task")
                                 and c["precision"] != "fp32"],
                                lambda c: -c["metrics"]["task"]["accuracy_drop_points"])

    def draw(ax: Any) -> bool:
        if not cases:
            return False
        deltas = [0.0 - c["metrics"]["task"]["accuracy_drop_points"] for c in cases]
        ax.bar(range(len(cases)), deltas, color=["#c0392b" if d < 0 else "#27ae60" for d in deltas])
        spans = [(c["metrics"]["task"].get("intervals") or {}).get("accuracy_drop_points") for c in cases]
        if all(spans):  # 95% interval of the change: −high … −low of the drop's
            errors = [[max(0.0, d - (-s["high"])) for d, s in zip(deltas, spans)],
                      [max(0.0, -s["low"] - d) for d, s in zip(deltas, spans)]]
            ax.errorbar(range(len(cases)), deltas, yerr=errors, fmt="none", ecolor="black", capsize=3,
                        label="95% interval")
            ax.legend(fontsize=7)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(cases)), [c["id"] for c in cases], rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(f"accuracy change (points){note}")
        return True

    return figure(draw)


def _plot_speedup(record: dict[str, Any]) -> str | None:
    found = speedups(record)
    names, note = _most_telling(list(found), lambda name: found[name])

    def draw(ax: Any) -> bool:
        if not found:
            return False
        ax.bar(range(len(names)), [found[n] for n in names], color="#8e44ad")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set_ylabel(f"× FP32 throughput (median latency ratio){note}")
        return True

    return figure(draw, height=5)


def _plot_histograms(record: dict[str, Any]) -> str | None:
    totals: dict[str, np.ndarray] = {}
    for case in _ran(record):
        hist = primary_metrics(case).get("error_histogram")
        if hist and len(hist) == len(HISTOGRAM_EDGES) - 1:  # a histogram of other bins is no histogram of these
            totals[case["precision"]] = totals.get(case["precision"], 0) + np.asarray(hist, dtype=float)

    def draw(ax: Any) -> bool:
        if not totals:
            return False
        upper = np.r_[HISTOGRAM_EDGES[1:-1], 10.0]  # the last bin, errors ≥ max |reference|, drawn at 10
        for precision in sorted(totals, key=precision_rank):
            counts = totals[precision]
            ax.plot(upper, counts / counts.sum(), marker="o", label=precision)
        ax.set_xscale("log")
        ax.set_xlabel("|error| / max |reference| (upper bin edge)")
        ax.set_ylabel("fraction of elements")
        ax.legend()
        return True

    return figure(draw)


def _plot_trend(records: list[dict[str, Any]]) -> str | None:
    def draw(ax: Any) -> bool:
        if len(records) < 2:
            return False
        per_precision: dict[str, list[float]] = defaultdict(list)
        for record in records:
            by_precision = defaultdict(list)
            for case in _ran(record):
                snr = primary_metrics(case).get("snr_db")
                if snr is not None and np.isfinite(snr):
                    by_precision[case["precision"]].append(snr)
            for precision in known_precisions()[1:]:
                per_precision[precision].append(float(np.mean(by_precision[precision])) if by_precision[precision] else np.nan)
        for precision, values in per_precision.items():
            if not np.all(np.isnan(values)):
                ax.plot(range(len(records)), values, marker="o", label=precision)
        ax.set_xticks(range(len(records)), [r["started"][:16] for r in records], rotation=30, fontsize=7)
        ax.set_ylabel("mean SNR vs FP32 (dB)")
        ax.legend()
        return True

    return figure(draw)
