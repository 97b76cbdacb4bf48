"""The commands of ``python -m quantverdict``, one module each with ``HELP``, ``add_arguments(parser)``
and ``run(args) -> exit code``; adding a command is adding a module and a line here."""
from __future__ import annotations

import argparse
import importlib
from types import ModuleType

COMMANDS = {"run": "run", "init": "init", "report": "report", "gate": "gate", "history": "history",
            "merge": "merge", "nightly": "nightly", "models": "models", "env": "env", "sensitivity": "sensitivity",
            "compare-recipes": "compare_recipes", "formats": "formats", "mutate": "mutate", "bench": "bench",
            "compare-timings": "compare_timings", "prune-cache": "prune_cache", "lock": "lock", "explain": "explain"}


def command(name: str) -> ModuleType:
    return importlib.import_module(f"quantverdict.run.commands.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantverdict", description="Accuracy and speed verdicts for quantized "
                                                                      "models: run, report, gate.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = command(name)
        module.add_arguments(subparsers.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def dispatch(args: argparse.Namespace) -> int:
    """Run the chosen command; bad input (a :class:`HarnessError`) is one ``error:`` line per problem, and a file the
    machine will not write or read (a full disk, a folder given for a file) one line, exit 2."""
    import sys

    from quantverdict.errors import HarnessError

    try:
        return command(args.command).run(args)
    except HarnessError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a folder where a file goes, no permission: the machine's, one line
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: cannot write or read {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
