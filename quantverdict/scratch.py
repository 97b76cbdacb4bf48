"""Work folders a process makes in the temporary directory, named by its process id, so that none outlives it: its own
are removed when it stops, a signal included (:mod:`quantverdict.run.interrupt`), and those of a process that is gone
(killed outright) by the next run. Standard library only: the interrupt handler imports it."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

PREFIX = "quantverdict-"  # then the kind of work, the owner's process id, and mkdtemp's own suffix


@contextmanager
def work_folder(kind: str) -> Iterator[Path]:
    """A new folder for ``kind`` of work, removed when the block ends; an orphan's are swept first."""
    sweep_orphans(kind)
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{kind}-{os.getpid()}-") as folder:
        yield Path(folder)


def remove_own() -> None:
    """Remove every work folder of this process: it is stopping where no ``with`` block ends (``os._exit``)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-{os.getpid()}-*"):
        shutil.rmtree(folder, ignore_errors=True)


def sweep_orphans(kind: str) -> None:
    """Remove the ``kind`` work folders of processes that are gone: one killed outright (SIGKILL, the kernel's
    out-of-memory killer) cleans nothing up, and a search's folder held the model's graph and every layer's outputs
    (141 MB)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}{kind}-*-*"):
        owner = folder.name[len(f"{PREFIX}{kind}-"):].partition("-")[0]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
