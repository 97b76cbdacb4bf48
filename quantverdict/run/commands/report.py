"""``quantverdict report``: render a run record as Markdown and a self-contained HTML page."""
from __future__ import annotations

import argparse
from pathlib import Path

from quantverdict.cache import atomic_write_bytes

HELP = 'render a run record as Markdown and a self-contained HTML page'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("record", type=Path)
    parser.add_argument("--history", type=Path, help="folder of earlier run records, for trends")
    parser.add_argument("--out-dir", type=Path, help="where RUN.md and RUN.html go (default: beside the record)")
    parser.add_argument("--history-db", type=Path, help="run history whose change points for this runner class the "
                                                        "page shows (default: history.sqlite beside the record)")
    parser.add_argument("--profile", default="nightly", choices=["nightly", "premerge"], help="history policy profile")


def run(args: argparse.Namespace) -> int:
    from quantverdict.report.load import history, load_record
    from quantverdict.report.record import HISTORY_DB
    from quantverdict.report.render import html_page, markdown
    from quantverdict.report.search_page import tradeoff_section

    from quantverdict.report.record import check_writable

    out = args.out_dir or args.record.parent
    check_writable(out, "the report")
    record = load_record(args.record)
    past = [r for r in history(args.history) if r.started != record.started] if args.history else []
    text = markdown(record)
    atomic_write_bytes(out / f"{args.record.stem}.md", text.encode())
    db = getattr(args, "history_db", None) or args.record.parent / HISTORY_DB
    sections = [tradeoff_section(record)]
    if db.is_file():
        from quantverdict.report.history import judge_history, load_policies
        from quantverdict.report.history_page import history_section

        profile = getattr(args, "profile", "nightly")
        verdicts = judge_history(db, load_policies(None, profile))
        sections.append(history_section(db, verdicts, record.environment.runner_class or "unknown", profile=profile))
    page = out / f"{args.record.stem}.html"
    atomic_write_bytes(page, html_page(record, past, sections).encode())
    print(text)
    print(f"page: {page}")
    return 0
