"""Ctrl-C that stops a run at once, cleanly: exit code 130 and one line, within two seconds.

Python turns SIGINT into KeyboardInterrupt only between bytecodes, so a native call that runs for
seconds (an ONNX Runtime session over a batch, an export, a calibration pass) would hold the exit back.
The signal's C handler writes its number to a wakeup file descriptor at once, whatever the main thread
is doing: a watchdog thread reads it and, if the interpreter has not exited within the grace, ends the
process. Ending it so (``os._exit``) skips finalizers, which is also why a module whose import the
interrupt cut short cannot crash the exit. Where the main thread reaches Python first, its SIGINT handler ends the
process there and then, raising nothing: a KeyboardInterrupt raised inside a Python callback that native code
called (pybind11) is an uncaught C++ exception, and the process aborted (-6) before the grace ran out. Nothing in the cache is lost: entries are renamed into place
whole, a writer's temporary is removed by the next build of its key, and locks die with the process.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Iterator

from quantverdict.errors import SIGINT_RECEIVED
from quantverdict.scratch import remove_own

MESSAGE = "interrupted: no run record or recipe lock written (the cache keeps only whole entries)"
AFTER_RECORD = "interrupted after the run record was written (its path is above)"
HOLD_LIMIT_S = 30.0  # how long the watchdog lets a held block (writing the record) finish before ending the process
_received = SIGINT_RECEIVED  # read below the run stage too (a user callable's KeyboardInterrupt)
_holding = threading.Event()  # within :func:`held`: a Ctrl-C waits for the block to end
_recorded = threading.Event()  # the run record is on disk: no line may say otherwise
_stopping = threading.Lock()  # the main thread and the watchdog may both stop: one line, once


def received() -> bool:
    """Whether a SIGINT arrived within :func:`exit_within`: no record may then claim a finished run, even if
    a library swallowed the KeyboardInterrupt."""
    return _received.is_set()
EXIT_CODE = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C
STOPPING = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and what CI's ``timeout`` sends
_which = [int(signal.SIGINT)]  # the stopping signal that arrived last


def note_sigint() -> None:
    """From now on a SIGINT is noted (:func:`received`) before the handler in place handles it (pytest's:
    Python's KeyboardInterrupt), so that a KeyboardInterrupt a user's callable raises by itself is told from
    the user's Ctrl-C. Only the main thread can install a handler; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "notes_sigint", False):
        return

    def noting(signum: int, frame: object) -> None:
        _received.set()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt

    noting.notes_sigint = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, noting)


def stop(code: int = EXIT_CODE) -> int:
    """Say so, remove this process's work folders, and end it now with ``code``, finalizers skipped (see the module
    docstring)."""
    if not _stopping.acquire(blocking=False):
        time.sleep(HOLD_LIMIT_S)  # the other thread is ending the process
    sys.stdout.flush()
    print(AFTER_RECORD if _recorded.is_set() else MESSAGE, file=sys.stderr, flush=True)
    remove_own()
    os._exit(code)


def on_sigint(signum: int, frame: object) -> None:
    """The process's SIGINT and SIGTERM handler (CI's ``timeout`` sends SIGTERM to the process alone), in place from
    the script's start to its end (see :func:`exit_within`); exit code 128 + the signal's number."""
    _received.set()
    _which[0] = signum
    if not _holding.is_set():
        stop(128 + signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Write the run record within the block: a Ctrl-C there ends the process when the block ends, and from then on
    every interrupt says the record was written (the block's end marks it so)."""
    _holding.set()
    try:
        yield
        _recorded.set()
    finally:
        _holding.clear()
    if _received.is_set():
        stop(128 + _which[0])


@contextlib.contextmanager
def exit_within(grace_s: float = 1.5) -> Iterator[None]:
    """Within the block, a SIGINT ends the process with :data:`EXIT_CODE` after at most ``grace_s``
    seconds, even if the main thread is inside a native call that does not return to Python."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write)

    def watch() -> None:
        try:
            while data := os.read(read, 64):
                for signum in STOPPING:
                    if signum in data:
                        _received.set()
                        time.sleep(grace_s)
                        waited = 0.0
                        while _holding.is_set() and waited < HOLD_LIMIT_S:
                            time.sleep(0.05)
                            waited += 0.05
                        stop(128 + signum)
        finally:
            os.close(read)

    _recorded.clear()
    threading.Thread(target=watch, name="quantverdict-interrupt", daemon=True).start()
    handlers = {signum: signal.signal(signum, on_sigint) for signum in STOPPING}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous)
        os.close(write)  # the watchdog reads end-of-file and returns
