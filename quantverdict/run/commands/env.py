"""``quantverdict env``: the GPU, the CPU's instruction sets, packages and the precision support matrix."""
from __future__ import annotations

import argparse
import json

HELP = "print GPU, packages and the precision support matrix"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    from quantverdict.capabilities import detect

    caps = detect()
    print(json.dumps({**caps.to_dict(), "precisions": caps.precision_matrix()}, indent=1))
    return 0
