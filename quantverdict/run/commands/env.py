"""``quantverdict env``: the GPU, the CPU's instruction sets, packages, the precision support matrix and where GPTQ's
matrix work runs (:mod:`quantverdict.precision.matrix_device`)."""
from __future__ import annotations

import argparse
import json

HELP = "print GPU, packages and the precision support matrix"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    from quantverdict.capabilities import detect
    from quantverdict.precision.matrix_device import matrix_key

    caps = detect()
    found = {**caps.to_dict(), "precisions": caps.precision_matrix(), "matrix_device": matrix_key()}
    print(json.dumps(found, indent=1))
    return 0
