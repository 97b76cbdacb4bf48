"""``quantverdict models``: list the registered models (built-in, zoo, installed packages', the manifest's)."""
from __future__ import annotations

import argparse

from quantverdict.run.commands.common import common_options, pipeline

HELP = "list registered models"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_options(parser)


def run(args: argparse.Namespace) -> int:
    models = pipeline(args).models
    for name in models.names():
        spec = models.get(name)
        shapes = ", ".join(f"{i.name}{list(i.shape)}" for i in spec.inputs)
        print(f"{name:<20} {spec.task:<15} {shapes}")
    return 0
