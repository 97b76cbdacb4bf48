"""``quantverdict nightly``: timed run of the full matrix + report, under reports/nightly/<time>/."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from quantverdict.run.commands import common, report
from quantverdict.run.commands.run import run_matrix
from quantverdict.run.settings import Settings

HELP = 'timed run of the full matrix + report, under reports/nightly/<time>/'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, default=Path("reports/nightly"))
    common.common_options(parser)


def run(args: argparse.Namespace) -> int:
    """Timed full matrix into reports/nightly/<time>/, then the page with the history's trends."""
    from quantverdict.report.record import HISTORY_DB

    folder = args.root / time.strftime("%Y%m%d-%H%M%S")
    db = args.root / HISTORY_DB  # one history for every nightly run, beside their folders
    code, record = run_matrix(Settings.resolve({**vars(args), "time": True, "report_dir": folder, "history_db": db},
                                               Path.cwd()))
    report.run(argparse.Namespace(record=record, history=args.root, out_dir=folder, history_db=db, profile="nightly"))
    return code
