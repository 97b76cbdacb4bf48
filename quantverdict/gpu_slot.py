"""One timing loop at a time on a GPU. pytest-xdist's workers that share a GPU (more workers than GPUs) would
otherwise time their cases at once and each measure the others' kernels too: on an H100 shared by two workers a
ResNet-50 at batch 64 timed slower in FP16 than in FP32 (34.6 against 29.4 ms median). Each loop takes the GPU's
lock, a file lock in the temporary folder named by the device's UUID, which every process on the host sees alike;
workers on other GPUs, and the work of workers between their timing loops, go on meanwhile. A recipe's matrix work on
the GPU (:mod:`quantverdict.precision.matrix_device`) takes the slot too."""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Iterator

from quantverdict.cache import file_lock


def this_gpu() -> str | None:
    """The physical GPU this process computes on (its UUID), or None where it has none."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuid = getattr(properties, "uuid", None)
    if uuid is not None:
        return str(uuid)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    return visible[torch.cuda.current_device()] if len(visible) > torch.cuda.current_device() and visible[0] else \
        str(torch.cuda.current_device())


@contextlib.contextmanager
def timing_slot(gpu: str | None) -> Iterator[None]:
    """Hold ``gpu`` for one timing loop (nothing to hold where ``gpu`` is None)."""
    if gpu is None:
        yield
        return
    with file_lock(Path(tempfile.gettempdir()) / f"quantverdict-timing-{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}.lock"):
        yield
