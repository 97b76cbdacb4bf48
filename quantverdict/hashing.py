"""Content keys: a SHA-256 over a canonical encoding of everything that affects an artifact (bytes,
arrays, JSON-able values), of a file's bytes, and of the harness's own source that makes it, so a code
change re-keys exactly what it touches."""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np


def content_hash(*parts: Any) -> str:
    """SHA-256 over a canonical encoding of ``parts`` (bytes, arrays, JSON-able values)."""
    digest = hashlib.sha256()
    for part in parts:
        _feed(digest, part)
    return digest.hexdigest()


def _feed(digest: "hashlib._Hash", part: Any) -> None:
    """``part``'s encoding into ``digest``, a header and then the bytes themselves: no copy of a graph's or a batch's
    bytes is made to hash them (updates in turn hash as their concatenation would)."""
    if isinstance(part, bytes):
        digest.update(b"b%d:" % len(part))
        digest.update(part)
    elif isinstance(part, np.ndarray):
        arr = np.ascontiguousarray(part)
        digest.update(f"a{arr.dtype.str}{arr.shape}:".encode())
        if arr.dtype.hasobject:  # Python objects (an ONNX string tensor's): their values, not their addresses
            _feed(digest, arr.tolist())
        else:
            digest.update(arr)  # its buffer, as ``tobytes`` copies it
    elif isinstance(part, dict):
        digest.update(b"{")
        for key in sorted(part):
            _feed(digest, str(key))
            _feed(digest, part[key])
        digest.update(b"}")
    elif isinstance(part, (list, tuple)):
        digest.update(b"[")
        for item in part:
            _feed(digest, item)
        digest.update(b"]")
    else:
        digest.update(("j" + json.dumps(part, sort_keys=True, default=str)).encode())


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read once per process while its size and mtime stay the same."""
    stat = Path(path).stat()
    return _file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def source_fingerprint(*modules: str) -> str:
    """Hash of the source files of ``modules`` (a package means every .py file in it).

    Part of every cache key, so that changing the code that makes an artifact invalidates it.
    """
    import importlib.util

    digest = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ValueError(f"no source for module {name!r}")
        origin = Path(spec.origin)
        files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
        for file in files:
            digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()
