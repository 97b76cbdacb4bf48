"""What the commands share: their settings (the command line over the project's), the pipeline those
settings make, and how numbers and sizes are read and printed."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from quantverdict.run.settings import COMMON, Settings, add_options

if TYPE_CHECKING:
    from quantverdict.run.pipeline import Pipeline


def common_options(parser: argparse.ArgumentParser) -> None:
    """``--manifest`` and ``--cache-dir``: what every command that reads models needs."""
    add_options(parser.add_argument, COMMON)


def settings(args: argparse.Namespace) -> Settings:
    """The command line over the project's [tool.quantverdict] over the defaults."""
    return Settings.resolve(vars(args), Path.cwd())


def pipeline(args: argparse.Namespace) -> "Pipeline":
    from quantverdict.run.pipeline import Pipeline

    return Pipeline.from_settings(settings(args))


def csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def fmt(value: float | None, spec: str, width: int) -> str:
    return f"{value:{spec}}".rjust(width) if value is not None else "-".rjust(width)


def size(text: str) -> int:
    """Bytes from '20G', '500M', '1.5T' or a plain number."""
    units = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    text = text.strip().upper().removesuffix("B")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 20G, 500M, or bytes)") from None
