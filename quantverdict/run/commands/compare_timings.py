"""``quantverdict compare-timings``: two saved pytest-benchmark runs: Mann-Whitney U and a  ratio per benchmark; exit 1 on a regression."""
from __future__ import annotations

import argparse
from pathlib import Path

HELP = 'two saved pytest-benchmark runs: Mann-Whitney U and a  ratio per benchmark; exit 1 on a regression'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", type=Path)
    parser.add_argument("current", type=Path)
    parser.add_argument("--ratio", type=float, default=1.1, help="median ratio that counts (default 1.1)")
    parser.add_argument("--alpha", type=float, default=0.002, help="Mann-Whitney p-value needed (default 0.002)")


def run(args: argparse.Namespace) -> int:
    from quantverdict.perf.timing_compare import compare_files

    result = compare_files(args.base, args.current, args.ratio, args.alpha)
    for change in result["changes"]:
        print(change.describe())
    for label in ("only_in_base", "only_in_current"):
        for name in result[label]:
            print(f"{label.replace('_', ' ')}: {name}")
    regressed = [c for c in result["changes"] if c.verdict == "regressed"]
    print(f"{len(regressed)} regression(s) of {len(result['changes'])} benchmark(s) "
          f"(needs ×{args.ratio:g} and p < {args.alpha:g})")
    return 1 if regressed else 0
