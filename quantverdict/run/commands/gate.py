"""``quantverdict gate``: compare a run with a baseline; exit 1 on a regression, 2 on bad input."""
from __future__ import annotations

import argparse
from pathlib import Path

from quantverdict.run.settings import add_options

HELP = 'compare a run with a baseline; exit 1 on a regression, 2 on bad input'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--current", type=Path, required=True)
    add_options(parser.add_argument, ("gate-policy",))


def run(args: argparse.Namespace) -> int:
    from quantverdict.report.gate import gate, load_policy
    from quantverdict.report.load import load_record
    from quantverdict.run.commands.common import settings

    policy = load_policy(settings(args)["gate-policy"])  # the option over the project's [tool.quantverdict]
    result = gate(load_record(args.baseline), load_record(args.current), policy)
    print(result.report())
    return result.exit_code
