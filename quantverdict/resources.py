"""What a stage costs the machine and what the machine has left: wall time, CPU-seconds and peak memory, measured
side by side, so that every figure the harness reports says what it took (a search's minutes on a 2-core runner, and
the memory that decides whether the kernel kills it)."""
from __future__ import annotations

import os
import resource
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from pydantic import BaseModel, ConfigDict

def available_memory() -> int | None:
    """Bytes this machine can give a process now without swapping (Linux's MemAvailable: free memory and the caches it
    can drop), else the free pages, where the OS says."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on this platform
        return None


def peak_memory_mb() -> float:
    """This process's peak resident memory (MB) since it started: Linux's VmHWM, which starts again at ``exec`` (the
    ``ru_maxrss`` a process reads of itself keeps what it forked from: a worker started by a 2 GB parent reads 2 GB)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux, where the above is read


_WORKER_PEAKS: list[float] = []  # each worker's own peak (MB), as it said before it ended


def worker_peak(megabytes: float) -> None:
    """Note a worker process's peak memory (its :func:`peak_memory_mb`, which it reports) for the costs measured."""
    _WORKER_PEAKS.append(megabytes)


class Cost(BaseModel):
    """What a stage took: wall seconds, CPU-seconds (this process's and the worker processes' it waited for) and the
    peak memory (MB) of this process since it started (a peak is never lower than the stage's own) and of the largest
    worker the stage started."""

    model_config = ConfigDict(frozen=True)

    wall_s: float
    cpu_s: float
    peak_mb: float
    worker_peak_mb: float = 0.0  # none started (and a record written before workers' peaks were kept)

    def words(self) -> str:
        workers = f", workers {self.worker_peak_mb / 1024:.1f} GB" if self.worker_peak_mb else ""
        return f"{self.wall_s:.0f} s, {self.cpu_s:.0f} CPU-s, peak memory {self.peak_mb / 1024:.1f} GB{workers}"


def cpu_seconds() -> float:
    """CPU-seconds of this process and of the worker processes it waited for."""
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


@contextmanager
def costed() -> Iterator[Callable[[], Cost]]:
    """The block's cost so far, asked of the function it gives."""
    begun, cpu, workers = time.perf_counter(), cpu_seconds(), len(_WORKER_PEAKS)

    def cost() -> Cost:
        return Cost(wall_s=round(time.perf_counter() - begun, 3), cpu_s=round(cpu_seconds() - cpu, 3),
                    peak_mb=round(peak_memory_mb(), 1),
                    worker_peak_mb=round(max(_WORKER_PEAKS[workers:], default=0.0), 1))

    yield cost
