"""``quantverdict init``: make a repository ready for ``pytest -m int8``: a starter manifest, the
project setting that names it, and .gitignore lines for what runs leave behind. Nothing that
exists is overwritten; each file is reported as written, extended or left alone."""
from __future__ import annotations

import argparse
from pathlib import Path

from quantverdict.cache import atomic_write_bytes
from quantverdict.documents import packaged
from quantverdict.run.settings import SETTINGS, TABLE, ProjectConfig

HELP = "a starter manifest, its project setting and .gitignore lines in a repository"
MANIFEST = "models.yaml"
IGNORED = (SETTINGS["cache-dir"].default + "/", SETTINGS["report-dir"].default + "/", ".benchmarks/")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, nargs="?", default=Path("."), help="the repository (default: here)")


def run(args: argparse.Namespace) -> int:
    folder: Path = args.folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    for line in [_manifest(folder), _config(folder), _gitignore(folder)]:
        print(line)
    print(f"\nnext: declare your models in {MANIFEST}, then: pytest -m int8   (or: quantverdict run)")
    return 0


def _manifest(folder: Path) -> str:
    path = folder / MANIFEST
    if path.exists():
        return f"{path}: exists, left alone"
    atomic_write_bytes(path, packaged("starter-models.yaml").read_bytes())
    return f"{path}: written (a starter manifest; every field documented inside)"


def _config(folder: Path) -> str:
    """``[tool.quantverdict] manifest = "models.yaml"`` in pyproject.toml (made if absent)."""
    path = folder / "pyproject.toml"
    if path.is_file() and ProjectConfig.find(folder).path == path:
        return f"{path}: has [tool.{TABLE}] already, left alone"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    table = f'[tool.{TABLE}]\nmanifest = "{MANIFEST}"\n'
    atomic_write_bytes(path, (text + ("\n" if text and not text.endswith("\n\n") else "") + table).encode())
    return f"{path}: {'extended with' if text else 'written with'} [tool.{TABLE}] manifest = \"{MANIFEST}\""


def _gitignore(folder: Path) -> str:
    path = folder / ".gitignore"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    present = {line.strip() for line in text.splitlines()}
    missing = [entry for entry in IGNORED if entry not in present and entry.rstrip("/") not in present]
    if not missing:
        return f"{path}: ignores {', '.join(IGNORED)} already"
    prefix = "" if not text or text.endswith("\n") else "\n"
    atomic_write_bytes(path, (text + prefix + "# quantverdict: artifact cache, run records, benchmark history\n" +
                              "\n".join(missing) + "\n").encode())
    return f"{path}: ignores {', '.join(missing)} now"
