"""What a stage costs the machine and what the machine has left: wall time, CPU-seconds and peak memory, measured
side by side, so that every figure the harness reports says what it took (a search's minutes on a 2-core runner, and
the memory that decides whether the kernel kills it)."""
from __future__ import annotations

import os
import resource


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


def worker_peaks() -> tuple[float, ...]:
    """The peaks noted so far, in the order the workers ended."""
    return tuple(_WORKER_PEAKS)


def cpu_seconds() -> float:
    """CPU-seconds of this process and of the worker processes it waited for."""
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime
