"""A run record rendered for people: a Markdown summary (CI logs, pull requests) and a
self-contained HTML page with the accuracy matrix and charts (matplotlib PNGs, base64-embedded).
"""
from __future__ import annotations

import html
import re
from collections import Counter
from typing import Sequence

from quantverdict.judge.compare import relation
from quantverdict.precision import precision_rank
from quantverdict.report.charts import plot_accuracy_delta, plot_histograms, plot_snr, plot_speedup, plot_trend
from quantverdict.report.load import case_margin
from quantverdict.report.rows import SUMMARY_HEADER, number, rows, summary_cells
from quantverdict.report.schema import CaseRecord, CheckRecord, RunRecord, SearchRecord


def markdown(record: RunRecord) -> str:
    env, gpu = record.environment, record.environment.gpu
    summary = ", ".join(f"{n} {status}" for status, n in sorted(record.summary.items()))
    costs = [case.cost for case in record.cases if case.cost is not None]
    spent = (f" ({sum(cost.cpu_s for cost in costs):.0f} CPU-s in its cases, peak memory "
             f"{max(cost.peak_mb for cost in costs) / 1024:.1f} GB)") if costs else ""
    lines = [f"# Accuracy run {record.started}", "",
             f"{summary} in {record.duration_s:.0f} s{spent} on {env.host or '?'} "
             f"({gpu.name + ', compute capability ' + gpu.compute_capability if gpu else 'no GPU'})", "",
             "| " + " | ".join(SUMMARY_HEADER) + " |", "|" + " --- |" * len(SUMMARY_HEADER)]
    for row in rows(record):
        if row.status != "skipped":
            cells = [_cell(cell) for cell in summary_cells(row)]
            cells[-1] = f"**{cells[-1]}**" if row.status != "passed" else cells[-1]
            lines.append("| " + " | ".join(cells) + " |")
    failures = [c for c in record.cases if c.status in ("failed", "error")]
    if failures:
        lines += ["", "## Failures", ""] + [f"- {_cell(c.id)}: {_cell((c.message or '-').splitlines()[-1])}"
                                           for c in failures]
    notes = {f"{c.model} {c.precision}": "; ".join(filter(None, [
        search.note, search.cost and f"the search took {search.cost.words()}"]))
        for c in record.cases if (search := _search(c)) is not None and (search.note or search.cost)}
    if notes:  # what the case's bounds would take where a searched recipe misses them, and what each search took
        lines += ["", "## Recipe searches", ""] + [f"- {_cell(case)}: {_cell(note)}" for case, note in notes.items()]
    regressed = regressions(record)
    if regressed:  # pytest --qv-baseline: each regression with what moved between the runs
        lines += ["", "## Regressions against the baseline", ""] + [
            f"- {_cell(case)}: {_cell(what)} ({_cell(moved)})" for case, what, moved in regressed]
    noted = case_notes(record)
    if noted:
        lines += ["", "## Notes", ""] + [f"- {_cell(note)} ({_cell(', '.join(cases))})" for note, cases in noted]
    stale = lock_notes(record)
    if stale:
        lines += ["", "## Locks that do not match this run", ""] + [f"- {_cell(case)}: {_cell(note)}" for case, note in stale]
    reasons = Counter(c.message for c in record.cases if c.status == "skipped")
    if reasons:
        lines += ["", "## Skipped", ""] + [f"- {n} × {_cell(reason)}" for reason, n in reasons.most_common()]
    return "\n".join(lines) + "\n"


def regressions(record: RunRecord) -> list[tuple[str, str, str]]:
    """(case, its regressions, what moved between the runs) of each case ``--qv-baseline`` found regressed."""
    return [(c.id, "; ".join(c.metrics.baseline.regressions), c.metrics.baseline.moved or "moved: -")
            for c in record.cases if c.metrics.baseline and c.metrics.baseline.regressions]


def case_notes(record: RunRecord) -> list[tuple[str, list[str]]]:
    """Each note the cases' comparisons kept (a bound widened to what the samples resolve, FP32 outputs the input
    barely moves), once, with the cases it came from: said in a pytest or CLI run's warnings only, they were lost to
    the page a team reads the nightly on."""
    found: dict[str, list[str]] = {}
    for case in record.cases:
        for view in filter(None, (case.metrics, case.metrics.recipe)):
            for note in view.notes:
                found.setdefault(note, [])
                if case.id not in found[note]:
                    found[note].append(case.id)
    return list(found.items())


def lock_notes(record: RunRecord) -> list[tuple[str, str]]:
    """(model and precision, note) of each recipe locked for another graph or calibration set, or whose precision
    graph this runner built otherwise, once each: a stale lock said so in the terminal only (and a hover tooltip)."""
    found = {f"{c.model} {c.precision}": c.metrics.recipe.lock.note for c in record.cases
             if c.metrics.recipe and c.metrics.recipe.lock and c.metrics.recipe.lock.note}
    return sorted(found.items())


def _search(case: CaseRecord) -> SearchRecord | None:
    """What the search that chose the case's recipe found, where one did."""
    return case.metrics.recipe.search if case.metrics.recipe else None


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
         ".charts img{width:560px}pre,code{white-space:pre-wrap;overflow-wrap:anywhere}")  # failures wrap


def page(title: str, body: list[str]) -> str:
    """A self-contained HTML page (styles inline, charts embedded)."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")


def html_page(record: RunRecord, history: list[RunRecord], sections: Sequence[str] = ()) -> str:
    """The run's page; ``sections``: more HTML at its end (the history's verdicts and trends)."""
    charts = [("Output accuracy per case", plot_snr(record)),
              ("Task-accuracy change vs FP32", plot_accuracy_delta(record)),
              ("Speedup over FP32 (same model and backend)", plot_speedup(record)),
              ("Error histograms per precision", plot_histograms(record)),
              ("Trend over the history of runs", plot_trend([*history, record]))]
    body = [f"<h1>Accuracy run {html.escape(record.started)}</h1>",
            f"<p>{html.escape(markdown(record).splitlines()[2])}</p>",
            f"<p>Runner class: {html.escape(str(record.environment.runner_class or 'unknown'))}</p>",
            _what_failed(record), "<h2>Accuracy matrix</h2>", _matrix(record),
            *(f'<p class="legend">{html.escape(case)}: {html.escape(note)}</p>' for case, note in lock_notes(record)),
            '<p class="legend">Cell colour: margin to the tolerance (green: over half the budget left; '
            "amber: less; red: failed; grey: skipped). Text: SNR in dB against the FP32 reference; in a failed case, the "
            "first bound it broke and its value.</p>"]
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
    body += [_regressions(record), _verdicts(record), _notes(record), _failures(record), _skips(record), *sections]
    return page("Accuracy run", body)


def _matrix(record: RunRecord) -> str:
    every = sorted({(c.precision, c.backend) for c in record.cases}, key=lambda pb: (precision_rank(pb[0]), pb[1]))
    ran = {(c.precision, c.backend) for c in record.cases if c.status != "skipped"}
    columns = [pb for pb in every if pb in ran]
    hidden = [f"{p} on {b}" for p, b in every if (p, b) not in ran]
    models = list(dict.fromkeys(c.model for c in record.cases))
    cells = {(c.model, c.precision, c.backend): c for c in record.cases}
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
            cls = "skip" if case.status == "skipped" else (
                "bad" if case.status != "passed" else "ok" if margin is None or margin > 0.5 else "thin")
            snr = case.metrics.measured().snr_db
            failed = _first_failed(case)
            text = "skip" if case.status == "skipped" else f"{failed.metric} {failed.observed:.3g}" if failed else (
                "∞" if snr == float("inf") else number(snr, ".0f"))
            title = html.escape(case.message or f"margin {margin:.2f}" if margin is not None else case.status)
            tds.append(f'<td class="{cls}" title="{title}">{text}</td>')
        rows.append(f"<tr><th>{html.escape(model)}</th>{''.join(tds)}</tr>")
    note = (f'<p class="legend">Columns left out, every case in them skipped (reasons under Skipped cases): '
            f'{html.escape(", ".join(hidden))}.</p>' if hidden else "")
    return f'<table class="matrix"><tr><th>model</th>{head}</tr>{"".join(rows)}</table>{note}'


def _first_failed(case: CaseRecord) -> CheckRecord | None:
    """The first bound a failed case broke (the recipe's, then the runtime's): its cell shows that, not an SNR that
    may be within every bound."""
    if case.status != "failed":
        return None
    views = [case.metrics.recipe, case.metrics] if case.metrics.recipe else [case.metrics]
    return next((check for view in views for check in view.checks if not check.passed), None)


def _what_failed(record: RunRecord) -> str:
    """The first screen's answer: each case that failed, the bound it broke and whose outputs broke it (the recipe's
    graph as written, or the runtime's), and the next step where the record holds one; each whole message is under
    Failures."""
    items = []
    for case in record.cases:
        if case.status not in ("failed", "error"):
            continue
        check = _first_failed(case)
        recipe = case.metrics.recipe
        by_recipe = check is not None and recipe is not None and check in recipe.checks
        said = (case.message or case.status).splitlines()[0] if check is None else (
            f"{check.output}: {check.metric} {check.observed:.4g}, must be {relation(check.higher_is_better)} "
            f"{check.bound:.4g} ({'the recipe' if by_recipe else 'the runtime'}'s outputs against FP32)")
        step = ""
        if by_recipe and recipe is not None:
            search = _search(case)
            noted = search.note if search else recipe.lock.search_note if recipe.lock else None
            step = noted or (
                f"the recipe itself misses the bound: quantverdict sensitivity {case.model} names the layers that cost "
                f"most, and recipe: {{{case.precision}: {{auto: true}}}} searches for one that meets it")
        elif check is not None and recipe is not None and recipe.passed:
            step = "the recipe meets its bounds: the runtime's kernels diverge from its graph (see Failures)"
        items.append(f"<li><b>{html.escape(case.id)}</b>: {html.escape(said)}"
                     + (f"<br>Next: {html.escape(step)}" if step else "") + "</li>")
    return ("<h2>What failed</h2><ul>" + "".join(items) + '</ul><p class="legend">Each case\'s whole message: '
            '<a href="#failures">Failures</a>.</p>') if items else ""


def _verdicts(record: RunRecord) -> str:
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


def _notes(record: RunRecord) -> str:
    items = "".join(f"<li>{html.escape(note)} <i>({html.escape(', '.join(cases))})</i></li>"
                    for note, cases in case_notes(record))
    return f"<h2>Notes</h2><ul>{items}</ul>" if items else ""


def _failures(record: RunRecord) -> str:
    failures = [c for c in record.cases if c.status in ("failed", "error")]
    if not failures:
        return '<h2 id="failures">Failures</h2><p>None.</p>'
    items = []
    for case in failures:
        divergence = case.metrics.first_divergence
        where = (f"<br>first diverging layer: <code>{html.escape(divergence.node)}</code> "
                 f"({html.escape(divergence.op)}), {html.escape(divergence.summary)}" if divergence else "")
        items.append(f"<li><b>{html.escape(case.id)}</b><pre>{html.escape(case.message)}</pre>{where}</li>")
    return f'<h2 id="failures">Failures</h2><ul>{"".join(items)}</ul>'


def _regressions(record: RunRecord) -> str:
    """Each regression against ``--qv-baseline``'s run, with what moved between the two runs (its attribution)."""
    rows = "".join(f"<tr><td>{html.escape(case)}</td><td style='text-align:left'>{html.escape(what)}</td>"
                   f"<td style='text-align:left'>{html.escape(moved)}</td></tr>"
                   for case, what, moved in regressions(record))
    return (f"<h2>Regressions against the baseline</h2><table><tr><th>case</th><th>regression</th><th>what moved"
            f"</th></tr>{rows}</table>") if rows else ""


def _skips(record: RunRecord) -> str:
    reasons = Counter(c.message for c in record.cases if c.status == "skipped")
    rows = "".join(f"<tr><td>{n}</td><td style='text-align:left'>{html.escape(r)}</td></tr>"
                   for r, n in reasons.most_common())
    return f"<h2>Skipped cases</h2><table><tr><th>cases</th><th>reason</th></tr>{rows}</table>" if rows else ""
