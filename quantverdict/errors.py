"""Errors a user can act on: each names the file, tensor, model or layer at fault.

The CLI prints them as one line and exits 2; the pytest plugin turns them into a failure
whose message is the same line.
"""
from __future__ import annotations

import difflib
import threading
from types import CodeType
from typing import Iterable

SIGINT_RECEIVED = threading.Event()  # set by quantverdict.run.interrupt's handlers: the user pressed Ctrl-C


class HarnessError(Exception):
    """Base class: anything raised on purpose for bad input or an unusable artifact."""


class UnknownNameError(HarnessError, KeyError):
    """A model, precision or backend name that is not registered."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        super().__init__(f"unknown {kind} {name!r}{hint} (known: {', '.join(known)})")

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


class ModelFileError(HarnessError):
    """A missing, unreadable or invalid ONNX (or other model) file."""


class InputSpecError(HarnessError):
    """A model spec whose declared inputs the model rejects."""

    trace = ""


class InputDataError(HarnessError):
    """Calibration or evaluation batches that do not fit the model's declared inputs (or hold NaN)."""


class CalibrationError(HarnessError):
    """Quantization asked for without usable calibration data."""


class ResourceError(HarnessError):
    """The machine could not give a stage what it needed (a worker the kernel killed, most likely for memory): not
    the recipe's or the technique's failure, so a search stops on it rather than choosing among fewer candidates than
    another runner would."""


class UnsupportedError(HarnessError):
    """A graph or combination a backend cannot build; ``ops`` names the op types it rejected."""

    def __init__(self, message: str, ops: tuple[str, ...] = ()):
        super().__init__(message)
        self.ops = ops


class UserCodeError(HarnessError):
    """A user's own code failed (a model factory, calibration or evaluation callable, a metric, the
    model's forward pass): ``what`` names it, ``trace`` keeps the traceback from the user's first frame."""

    def __init__(self, what: str, error: BaseException):
        super().__init__(f"{what} failed: {type(error).__name__}: {error}")
        self.trace = user_trace(error)


def interrupted(error: BaseException) -> bool:
    """Whether a KeyboardInterrupt is ``error`` or what caused it: extension modules turn one that lands in
    their import into another error (ONNX Runtime's pybind11 module: "ImportError: initialization failed")."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return False


def user_trace(error: BaseException, entry: CodeType | None = None) -> str:
    """``error``'s traceback without the harness's own frames above the user's code; from the frame running ``entry``
    (the user's forward, called through a tracer's frames) where it is on the traceback."""
    import traceback
    from pathlib import Path

    package = str(Path(__file__).resolve().parent)
    frames = error.__traceback__
    while frames is not None and frames.tb_next is not None and \
            str(Path(frames.tb_frame.f_code.co_filename).resolve()).startswith(package):
        frames = frames.tb_next
    entered = frames
    while entry is not None and entered is not None and entered.tb_frame.f_code is not entry:
        entered = entered.tb_next
    return "".join(traceback.format_exception(type(error), error, entered or frames)).rstrip()


class ResolutionWarning(UserWarning):
    """A bound finer than the evaluation samples resolve, widened to one sample's worth."""
