"""Content-addressed artifact cache shared by every pipeline stage.

Each artifact lives at ``<root>/<kind>/<key[:2]>/<key><suffix>`` next to a ``.json`` sidecar
holding the SHA-256 of its bytes and the readable inputs of its key. Writes go to a temporary
file in the same directory and are renamed into place, so a reader never sees half a file; the
sidecar is published before the artifact, so whoever sees an artifact finds its checksum. A
per-key ``flock`` lets concurrent processes (pytest-xdist workers, CI jobs on one cache volume)
build each artifact once. A lookup outside the lock only reads; an entry that does not verify
there is looked at again under the lock, and only then, if its bytes no longer match its
sidecar, moved aside (``*.corrupt``) and rebuilt, never used. A writer killed mid-write leaves a
temporary that the next build of that key, or ``prune``, removes.
A hit touches the sidecar, so its time is the entry's last use: :meth:`Cache.prune` removes the
least recently used entries (every code change re-keys what it touches, so a nightly runner's
cache otherwise only grows).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator


from quantverdict.errors import HarnessError
from quantverdict.hashing import content_hash, file_sha256

if TYPE_CHECKING:
    import numpy as np


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one. A path that is a
    device, a pipe or a folder is refused (an ``OSError``), not replaced: renamed over by a process with the rights,
    ``--out /dev/full`` became a regular file."""
    if path.exists() and not path.is_file():
        raise OSError(errno.EINVAL, "not a regular file (a folder, a device or a pipe), so not replaced", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; artifacts and reports are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def file_lock(path: Path, wait: bool = True) -> Iterator[bool]:
    """An exclusive advisory lock held for the ``with`` block (works across processes); with
    ``wait=False`` the block runs at once and is told whether it holds the lock (False: someone else does). A folder
    is locked as itself (``flock`` takes any open file), so nothing is left behind."""
    folder = path.is_dir()
    if not folder:
        path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_RDONLY if folder else os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
        try:
            yield held
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        os.close(handle)


GRACE_S = 3600.0  # entries used this recently may be in use by a running process: prune keeps them
_ENTRY_NAME = re.compile(r"^\.?([0-9a-f]{64})")  # an artifact, its sidecar, a temporary (dot first), a *.corrupt


@dataclass
class Cache:
    """Artifacts by kind and key; ``stats`` counts hits, misses and corrupt entries per kind."""

    root: Path
    stats: Counter = field(default_factory=Counter)

    def path(self, kind: str, key: str, suffix: str) -> Path:
        return self.root / kind / key[:2] / f"{key}{suffix}"

    def get_or_create(
        self,
        kind: str,
        key: str,
        suffix: str,
        produce: Callable[[], bytes],
        describe: dict[str, Any] | None = None,
    ) -> Path:
        """Return the path of the artifact for ``key``, calling ``produce`` only on a miss."""
        path = self.path(kind, key, suffix)
        if self._verified(path, key):  # reads only: another process may be writing this entry right now
            self.stats[f"{kind}.hit"] += 1
            with contextlib.suppress(OSError):  # last use, for prune; a read-only cache still serves
                os.utime(_sidecar(path))
            return path
        with file_lock(self.root / "locks" / kind / f"{key}.lock"):
            if self._valid(kind, path, key):  # another process built it while we waited
                self.stats[f"{kind}.hit"] += 1
                return path
            _remove_temporaries(path)  # a writer of this key that was killed mid-write
            data = produce()
            meta = {"sha256": hashlib.sha256(data).hexdigest(), "key": key, "inputs": describe or {}}
            try:
                atomic_write_bytes(_sidecar(path), json.dumps(meta, indent=1, default=str).encode())
                atomic_write_bytes(path, data)
            except OSError as exc:  # a full or read-only disk: name the place
                raise CacheError(f"cannot write cache entry {path}: {exc.strerror or exc}") from exc
            self.stats[f"{kind}.miss"] += 1
            return path

    def arrays(self, kind: str, parts: list[Any], make: Callable[[], tuple[dict[str, "np.ndarray"], str]],
               describe: dict[str, Any]) -> tuple[dict[str, "np.ndarray"], str]:
        """Named arrays and a label (outputs, and the runtime that made them), made once per content key of
        ``parts`` and stored as .npz (no pickles)."""
        import io

        import numpy as np

        def produce() -> bytes:
            arrays, label = make()
            buffer = io.BytesIO()
            names = list(arrays)
            np.savez(buffer, __meta__=np.array(json.dumps({"names": names, "label": label})),
                     **{f"a{i}": np.asarray(arrays[name]) for i, name in enumerate(names)})
            return buffer.getvalue()

        path = self.get_or_create(kind, content_hash(kind, parts), ".npz", produce, describe)
        with np.load(path, allow_pickle=False) as stored:
            meta = json.loads(str(stored["__meta__"]))
            return {name: stored[f"a{i}"] for i, name in enumerate(meta["names"])}, meta["label"]

    def holds_arrays(self, kind: str, parts: list[Any]) -> bool:
        """Whether :meth:`arrays` of ``parts`` would read, not make: a caller makes the missing ones together."""
        key = content_hash(kind, parts)
        return self._verified(self.path(kind, key, ".npz"), key)

    def json(self, kind: str, parts: list[Any], make: Callable[[], Any], describe: dict[str, Any]) -> Any:
        """A JSON-able result (a diagnosis, a count, a choice) made once per content key of ``parts``."""
        path = self.get_or_create(kind, content_hash(kind, parts), ".json",
                                  lambda: json.dumps(make(), default=str).encode(), describe)
        return json.loads(path.read_text())

    def prune(self, max_bytes: int | None = None, unused_for_s: float | None = None,
              grace_s: float = GRACE_S) -> "PruneResult":
        """Remove whole entries, least recently used first: every one unused for ``unused_for_s``
        seconds, then more until the cache holds at most ``max_bytes``. An entry used within ``grace_s``
        (a run in progress may hold its path) or being built (its lock held) stays; so do lock files
        and anything not laid out as an entry. Leftovers of an entry (a crashed write's temporary, a
        quarantined ``*.corrupt`` file) go with it."""
        now = time.time()
        entries = sorted(self._entries(), key=lambda entry: entry.last_use)
        size = sum(entry.size for entry in entries)
        result = PruneResult(kept_bytes=size)
        for entry in entries:
            stale = unused_for_s is not None and now - entry.last_use > unused_for_s
            if not stale and (max_bytes is None or result.kept_bytes <= max_bytes):
                continue
            if now - entry.last_use <= grace_s or not self._remove(entry, now - grace_s):
                continue
            result.removed += 1
            result.freed_bytes += entry.size
            result.kept_bytes -= entry.size
        result.kept = len(entries) - result.removed
        return result

    def _entries(self) -> Iterator["_Entry"]:
        """Each entry's files (artifact, sidecar, leftovers), grouped by kind and key."""
        if not self.root.is_dir():
            return
        for kind in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != "locks"):
            for shard in sorted(p for p in kind.iterdir() if p.is_dir() and len(p.name) == 2):
                groups: dict[str, list[Path]] = {}
                for item in shard.iterdir():
                    match = _ENTRY_NAME.match(item.name)
                    if item.is_file() and match and match.group(1).startswith(shard.name):
                        groups.setdefault(match.group(1), []).append(item)
                for key, files in groups.items():
                    try:
                        size, last_use = sum(f.stat().st_size for f in files), _last_use(files)
                    except FileNotFoundError:  # removed meanwhile (rebuilt, quarantined, pruned elsewhere)
                        continue
                    yield _Entry(kind.name, key, files, size, last_use)

    def _remove(self, entry: "_Entry", used_since: float) -> bool:
        """Delete an entry's files under its lock, unless someone holds the lock (building it) or a hit
        touched it after ``used_since`` while the cache was being listed."""
        with file_lock(self.root / "locks" / entry.kind / f"{entry.key}.lock", wait=False) as held:
            try:
                if not held or _last_use(entry.files) > used_since:
                    return False
            except FileNotFoundError:  # another prune, or a quarantine, got there first
                return False
            for item in entry.files:
                with contextlib.suppress(FileNotFoundError):
                    item.unlink()
        return True

    def _verified(self, path: Path, key: str) -> bool:
        """The artifact and its sidecar are files of this cache (not links, nothing outside it), the sidecar
        records ``key`` (an entry swapped for another key's is not served) and the artifact's checksum (no side
        effects: safe without the lock)."""
        try:
            sidecar = _sidecar(path)
            if path.is_symlink() or sidecar.is_symlink() or not path.resolve().is_relative_to(self.root.resolve()):
                return False
            meta = json.loads(sidecar.read_text())
            return meta["key"] == key and meta["sha256"] == file_sha256(path)
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def _valid(self, kind: str, path: Path, key: str) -> bool:
        """Under the entry's lock: verified, or (if anything of it is there) quarantined."""
        if self._verified(path, key):
            return True
        if path.exists() or path.is_symlink():
            self._quarantine(kind, path)
        else:  # a sidecar alone: a write cut short between the sidecar's rename and the artifact's
            with contextlib.suppress(FileNotFoundError):
                _sidecar(path).unlink()
        return False

    def _quarantine(self, kind: str, path: Path) -> None:
        self.stats[f"{kind}.corrupt"] += 1
        warnings.warn(f"cache entry {path} does not match its checksum or its key, or is a link: moved aside and rebuilt")
        for item in (path, _sidecar(path)):
            with contextlib.suppress(FileNotFoundError):
                os.replace(item, item.with_name(item.name + ".corrupt"))


@dataclass
class _Entry:
    kind: str
    key: str
    files: list[Path]
    size: int
    last_use: float


@dataclass
class PruneResult:
    """What :meth:`Cache.prune` removed and kept (entries, bytes)."""

    removed: int = 0
    freed_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0


def _last_use(files: list[Path]) -> float:
    """An entry's last use: its newest file's time (a hit touches the sidecar)."""
    return max(f.stat().st_mtime for f in files)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _remove_temporaries(path: Path) -> None:
    """Temporaries of ``path`` and its sidecar left by a writer that died (called under the entry's lock)."""
    for leftover in path.parent.glob(f".{path.name}*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()


class CacheError(HarnessError):
    """A cache entry that cannot be written (a full or read-only disk), named with its path."""
