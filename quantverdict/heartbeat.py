"""The heartbeat any long step of a run says it by: a line as it starts and another every :data:`HEARTBEAT_S` while
it works (a search's candidates, a failed case's diagnoses), so that a log silent for minutes never reads as a hang."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

HEARTBEAT_S = 10.0  # the longest a long step of a run stays silent while it works
T = TypeVar("T")


@contextmanager
def heartbeat(say: Callable[[float], None], every: float = HEARTBEAT_S) -> Iterator[None]:
    """``say(seconds so far)`` every ``every`` seconds while the block runs: a candidate that ranks every layer
    quantized alone takes minutes, and a log that says nothing for them reads as a hang."""
    stop, begun = threading.Event(), time.monotonic()

    def beat() -> None:
        while not stop.wait(every):
            say(time.monotonic() - begun)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def told(say: Callable[[str], None] | None, what: str, produce: Callable[[], T]) -> T:
    """``produce()``, with ``what`` said as it starts and again every :data:`HEARTBEAT_S` while it runs, where ``say``
    shows progress: a failed case's diagnosis takes minutes on a large network at its deployment batch."""
    if say is None:
        return produce()
    say(what)
    with heartbeat(lambda seconds: say(f"{what}: still at it after {seconds:.0f} s")):
        return produce()
