"""What each pytest-xdist worker pays to start that the run could avoid: importing a package whose Python source has
no bytecode beside it, where none is written either (``PYTHONDONTWRITEBYTECODE=1``, as container images often set it,
with a package installed without compiling, as uv installs by default), compiles it again in every worker. On the
4 × H200 host, whose PyTorch is installed so, that was 7.7 s of each worker's start and first case (3,318 modules)."""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Sequence

HEAVY = ("torch", "torchvision")  # the packages a worker imports whose compile costs seconds


def uncompiled(package: str) -> str | None:
    """The folder of ``package`` where importing it compiles its source anew in every process: no bytecode for its
    ``__init__`` where this interpreter looks for it (``PYTHONPYCACHEPREFIX`` included), and none will be written
    (``PYTHONDONTWRITEBYTECODE``, or a folder this process may not write). None where it is compiled, or absent."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    cached = importlib.util.cache_from_source(spec.origin)
    if os.path.exists(cached):
        return None
    existing = os.path.dirname(cached)  # the interpreter makes the folders it lacks: the nearest that exists decides
    while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    return os.path.dirname(spec.origin) if sys.dont_write_bytecode or not os.access(existing, os.W_OK) else None


def recompiled_note(workers: int, packages: Sequence[str] = HEAVY) -> str | None:
    """One line for a run of ``workers`` pytest-xdist workers where each compiles one of ``packages`` again, saying
    how to compile it once; None where none does."""
    folders = [folder for folder in map(uncompiled, packages) if folder]
    if workers < 2 or not folders:
        return None
    return (f"each of the {workers} pytest-xdist workers compiled {', '.join(map(os.path.basename, folders))} again "
            "as it imported it (no bytecode is installed beside the source, and none is written here): seconds of "
            f"every worker's start; compile once with python -m compileall -q {' '.join(folders)} in this environment, "
            "or let the first import write it (PYTHONDONTWRITEBYTECODE unset, and PYTHONPYCACHEPREFIX naming a "
            "writable folder where the package's own is not)")
