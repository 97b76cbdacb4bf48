"""``python -m quantverdict`` and the ``quantverdict`` console script: the commands of
:mod:`quantverdict.run.commands`. Bad input (unknown names, corrupt files, a model that rejects its
inputs) is printed as one line per problem, ``error: …``, with exit code 2; failing cases give exit code 1;
Ctrl-C gives 130 and one line. Only the standard library is imported before the interrupt handler is
in place, so a Ctrl-C at any moment ends the same way."""
from __future__ import annotations

import gc
import signal
import sys
import warnings
from pathlib import Path
from typing import NoReturn, Sequence

from quantverdict.run.interrupt import STOPPING, exit_within, on_sigint, stop


def main(argv: Sequence[str] | None = None) -> int:
    try:
        with exit_within():
            from quantverdict.run.commands import build_parser, dispatch

            return dispatch(build_parser().parse_args(argv))
    except KeyboardInterrupt:
        return stop()


def script() -> NoReturn:
    """The process's entry: a Ctrl-C ends it the same way from its start until the command returns; after that the
    command's output and exit code are whole, and the interpreter's teardown (torch's takes a second) ignores it, where
    Python would die of the signal or print a traceback. What the command made is left to the operating system, not
    to the teardown's garbage collection (``gc.freeze``: 0.8 s of a 17 s ``lock --check``, deallocating)."""
    for signum in STOPPING:  # Ctrl-C, and CI's ``timeout`` (SIGTERM to the process alone)
        signal.signal(signum, on_sigint)
    warnings.formatwarning = one_line
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()
    sys.exit(code)


PACKAGE = Path(__file__).resolve().parents[1]


def one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             line: str | None = None) -> str:
    """A warning as the command prints it: one line, ``warning: …``, with its kind and place only where another
    package's code warned (Python's own format adds the source line: for the harness's warnings, a call inside it)."""
    ours = Path(filename).resolve().is_relative_to(PACKAGE)
    return f"warning: {message}" + ("" if ours else f" ({category.__name__}, {filename}:{lineno})") + "\n"
