"""What ``recipe: auto`` found, for people: for each searched model and precision, the held-out SNR of the best
candidate at each share of the weighted layers kept in a wider format (FP16 or FP32), and whether it met the case's
bounds (a table and a chart). A deployment team reads there what a stricter target would cost in float layers before
asking for it."""
from __future__ import annotations

import html
from typing import Any

from quantverdict.report.charts import figure
from quantverdict.report.schema import RunRecord, SearchRecord


def _searched(record: RunRecord) -> dict[tuple[str, str], SearchRecord]:
    """Each (model, precision)'s search with a trade-off, once (every backend of a case reads the same search)."""
    found: dict[tuple[str, str], SearchRecord] = {}
    for case in record.cases:
        search = case.metrics.recipe.search if case.metrics.recipe else None
        if search is not None and search.tradeoff:
            found.setdefault((case.model, case.precision), search)
    return found


def tradeoff_section(record: RunRecord) -> str:
    """The page's section on the searches' trade-offs; empty where no case's recipe was searched in this run."""
    searches = _searched(record)
    searched = {case: search.tradeoff for case, search in searches.items()}
    if not searched:
        return ""

    def draw(ax: Any) -> bool:
        for (model, precision), points in searched.items():
            shares = [100 * point.share for point in points]
            line = ax.plot(shares, [point.score_db for point in points], label=f"{model} {precision}")
            for point, share in zip(points, shares):
                ax.plot([share], [point.score_db], marker="o" if point.passed else "x",
                        markersize=11 if point.chosen else 7, color=line[0].get_color(),
                        fillstyle="full" if point.chosen else "none", linestyle="none")
        ax.set_xlabel("weighted layers kept in FP16 or FP32 (%)")
        ax.set_ylabel("held-out output SNR (dB)")
        ax.legend(fontsize=8)
        return True

    rows = "".join(
        f"<tr><td>{html.escape(model)}</td><td>{html.escape(precision)}</td><td>{point.share:.0%}</td>"
        f"<td>{point.layers_in_float}</td><td>{(point.format or '').upper()}</td>"
        f"<td>{point.score_db:.2f}</td>"
        f"<td>{'met' if point.passed else 'missed' if point.passed is False else '–'}</td>"
        f"<td>{'chosen' if point.chosen else ''}</td>"
        f"<td style='text-align:left'>{html.escape(point.settings.words())}</td>"
        "</tr>"
        for (model, precision), points in searched.items() for point in points)
    costs = "".join(f"<li>{html.escape(model)} {html.escape(precision)}: {search.cost.words()}</li>"
                    for (model, precision), search in searches.items() if search.cost is not None)
    png = figure(draw, width=7, height=3.2)
    chart = f'<img alt="recipe search trade-off" src="data:image/png;base64,{png}">' if png else ""
    return ("<h2>Recipe search: layers kept wider against held-out accuracy</h2>"
            '<p class="legend">For each share of the weighted layers kept in a wider format, the best candidate the '
            "search judged with it, on calibration samples its calibration did not see: output SNR against FP32 and "
            "whether the case's bounds held (chart: o met, x missed; larger: chosen). The search judges no "
            "candidate for this table, so the other settings may differ between rows.</p>"
            f"{chart}<table><tr><th>model</th><th>precision</th><th>share kept wider</th><th>layers</th><th>in</th>"
            f"<th>SNR dB</th><th>bounds</th><th></th><th>settings</th></tr>{rows}</table>"
            + (f'<p class="legend">What each search took, where it ran (a search read from the cache took nothing '
               f"in this run):</p><ul>{costs}</ul>" if costs else ""))
