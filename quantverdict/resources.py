"""What a stage costs the machine and what the machine has left: wall time, CPU-seconds and peak memory, measured
side by side, so that every figure the harness reports says what it took (a search's minutes on a 2-core runner, and
the memory that decides whether the kernel kills it)."""
from __future__ import annotations

import os
import resource
from contextlib import contextmanager
from typing import Callable, Iterator


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
    ``ru_maxrss`` a process reads of itself keeps what it forked from: a worker started by a 2 GB parent reads 2 GB),
    and what it was before a block measured its own (:func:`peak_within`)."""
    return max(_BEFORE_RESET.mb, _high_water())


class _Peak:
    """A peak (MB) kept across the kernel's high-water mark set back: the process's, or an open block's."""

    def __init__(self) -> None:
        self.mb = 0.0


_BEFORE_RESET = _Peak()  # the process's peak when its high-water mark was last set back
_OPEN: list[_Peak] = []  # each open block's peak when the mark was last set back inside it


@contextmanager
def peak_within() -> Iterator[Callable[[], float]]:
    """The block's own peak resident memory (MB), asked of the function it gives: the kernel's high-water mark set back
    to the memory resident as it begins (Linux's ``clear_refs``), so that the second model a ``lock`` searches is not
    reported at the first one's peak; where that cannot be done, the process's peak since it started (never lower)."""
    block = _Peak()
    own = _set_back()
    _OPEN.append(block)
    try:
        yield lambda: max(block.mb, _high_water()) if own else peak_memory_mb()
    finally:
        _OPEN[:] = [each for each in _OPEN if each is not block]


def _set_back() -> bool:
    """Set the high-water mark back to the memory resident now, what it was kept for the process and each open block;
    whether the kernel did."""
    before = _high_water()
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # "reset the peak resident set size to the process's current value" (proc(5))
    except OSError:  # not Linux, or a kernel older than 4.0
        return False
    for peak in (_BEFORE_RESET, *_OPEN):
        peak.mb = max(peak.mb, before)
    return True


def _high_water() -> float:
    """The kernel's high-water mark of this process's resident memory (MB): VmHWM, else ``ru_maxrss``."""
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
