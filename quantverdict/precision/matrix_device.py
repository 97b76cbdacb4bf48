"""Where a recipe's float64 matrix work runs — GPTQ's H (the products of each layer's unfolded inputs) and its
rounding's factorization and block updates: on the runner's GPU where it has one, else on the CPU.

On a CPU they are most of a GPTQ search's own work (the 35M encoder's H and rounding, two threads of a search's small
pools) and of a nightly check whose recipe or alternatives round with GPTQ. A GPU's float64 arithmetic sums in
another order than a CPU's BLAS: H moves in its last bits, as it does between two CPUs' BLAS code paths, and a rounding
almost always absorbs that, not always; so the device is part of the key of every graph GPTQ rounds and of every
search (:func:`matrix_key`). ``QUANTVERDICT_MATRIX_DEVICE=cpu`` keeps the work on the CPU (the same bytes as a
runner without a GPU, where the CPUs' BLAS agree); ``cuda`` asks for the GPU and fails where there is none.
Under pytest-xdist, workers that share a GPU time their cases one at a time on it (:mod:`quantverdict.gpu_slot`):
this work takes the same slot, so that no timing loop measures it.
"""
from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Iterator

from quantverdict.capabilities import GPU, detect
from quantverdict.errors import HarnessError, ResourceError
from quantverdict.gpu_slot import this_gpu, timing_slot
from quantverdict.precision.pools import loaded_torch

if TYPE_CHECKING:
    import torch

VARIABLE = "QUANTVERDICT_MATRIX_DEVICE"
CHOICES = ("auto", "cpu", "cuda")  # auto (unset): the GPU where the runner has one


def matrix_gpu() -> GPU | None:
    """The GPU the matrix work runs on (torch's ``cuda:0``), or None for the CPU; read from the driver's listing where
    that answers for torch (:func:`quantverdict.capabilities.detect`: torch not imported)."""
    asked = os.environ.get(VARIABLE, "auto").strip().lower() or "auto"
    if asked not in CHOICES:
        raise HarnessError(f"{VARIABLE}={os.environ[VARIABLE]!r}: expected one of {', '.join(CHOICES)}")
    if asked == "cpu":
        return None
    gpu = detect().gpu
    if gpu is None and asked == "cuda":
        raise HarnessError(f"{VARIABLE}=cuda: this runner has no CUDA GPU that torch sees")
    return gpu


def matrix_key() -> str:
    """The device in a cache key: ``cpu``, or ``cuda`` and the GPU's name."""
    gpu = matrix_gpu()
    return "cpu" if gpu is None else f"cuda {gpu.name}"


def torch_device() -> "torch.device":
    """:func:`matrix_gpu`'s answer as torch's device (torch loaded: only the work itself asks)."""
    return loaded_torch().device("cpu" if matrix_gpu() is None else "cuda")


@contextlib.contextmanager
def held(device: "torch.device") -> Iterator[None]:
    """The GPU's timing slot while inside, where ``device`` is one (nothing to hold on the CPU); the GPU's memory
    running out inside is one line (:class:`~quantverdict.errors.ResourceError`: a search stops on it), not a
    traceback, nor the work moved to the CPU behind a key that names the GPU."""
    if device.type != "cuda":
        yield
        return
    torch = loaded_torch()
    with timing_slot(this_gpu()):
        try:
            yield
        except torch.cuda.OutOfMemoryError as error:
            free, total = torch.cuda.mem_get_info()
            raise ResourceError(f"GPTQ's matrix work ran out of memory on the GPU ({free / 2**30:.1f} of "
                                f"{total / 2**30:.1f} GiB free): {VARIABLE}=cpu keeps it on the CPU") from error
