"""``quantverdict history``: judge every case's metric series over the run history, and its completeness (exit 1 on
a regression or a case judged in one run and not in the next, 2 on bad input)."""
from __future__ import annotations

import argparse
import html
from pathlib import Path

from quantverdict.cache import atomic_write_bytes

HELP = ("judge every case's metric series over the run history, and that each case its runner class judged is judged "
        "in the next run; exit 1 on a regression or a case no longer judged, 2 on bad input")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history-db", type=Path, default=Path("reports/history.sqlite"),
                        help="the run history (default: reports/history.sqlite)")
    parser.add_argument("--profile", default="nightly", choices=["nightly", "premerge"])
    parser.add_argument("--history-policy", type=Path, help="history policy file (default: the packaged one)")
    parser.add_argument("--all", action="store_true", help="also list (and with --page, draw) stable series")
    parser.add_argument("--page", type=Path, help="also write an HTML page: what changed since the last good run, "
                                                   "and a trend chart per flagged series with its change points")


def run(args: argparse.Namespace) -> int:
    import time as clock
    from collections import Counter

    from quantverdict.report.history import UNCHECKED, judge_history, load_policies, run_packages, unjudged
    from quantverdict.report.history_page import package_diff

    if args.page:
        from quantverdict.report.record import check_writable

        check_writable(args.page.parent, "the history page")
    start = clock.perf_counter()
    verdicts = judge_history(args.history_db, load_policies(args.history_policy, args.profile))
    shown = [v for v in verdicts if args.all or v.verdict.state not in ("stable", "insufficient data")]
    runs = sorted({v.series.run_ids[i] for v in shown for i in (v.last_good, -1) if i is not None})
    packages = run_packages(args.history_db, runs) if runs else {}
    for verdict in shown:
        print(verdict.describe())
        good, series = verdict.last_good, verdict.series
        if good is not None and verdict.verdict.state != "stable":  # what moved since the last good run
            commits = " → ".join((series.commits[i] or "?")[:12] for i in (good, -1))
            print(f"  since run {series.run_ids[good]}: packages changed: "
                  f"{package_diff(packages.get(series.run_ids[good], {}), packages.get(series.run_ids[-1], {}))}; "
                  f"commit {commits}")
    counts = Counter(v.verdict.state for v in verdicts)
    gaps = unjudged(args.history_db)
    for line in gaps:
        print(line)
    gaps = [line for line in gaps if line != UNCHECKED]  # said, not failed: an older history cannot tell
    print(f"{len(verdicts)} series ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}) "
          f"judged in {clock.perf_counter() - start:.1f} s, profile {args.profile}"
          + (f"; {len(gaps)} case(s) judged in one run and not in the next" if gaps else ""))
    if args.page:
        from quantverdict.report.history_page import history_section
        from quantverdict.report.render import page

        body = [f"<h1>Run history {html.escape(str(args.history_db))}</h1>",
                history_section(args.history_db, verdicts, draw_all=args.all, profile=args.profile)]
        atomic_write_bytes(args.page, page("Run history", body).encode())
        print(f"page: {args.page}")
    return 1 if counts["regression"] or gaps else 0
