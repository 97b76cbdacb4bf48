"""A name → object registry with lazy ``"module:attr"`` entries, entry-point groups for installed
packages' additions, and typo suggestions. Listing names imports nothing (a registry's entries are
imported when first got), so the names can mark tests and order tables before any backend or recipe
loads."""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from quantverdict.errors import HarnessError, UnknownNameError

T = TypeVar("T")


def import_object(ref: str) -> object:
    """Import ``"package.module:attr"`` (the form used by entry points and the manifest)."""
    module_name, _, attr = ref.partition(":")
    if not attr:
        raise ValueError(f"expected 'module:attribute', got {ref!r}")
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Objects, or lazy ``"module:attr"`` references to them, under unique names; with ``group``, an
    entry-point group whose entries (from installed packages) join after the built-in ones."""

    def __init__(self, kind: str, group: str | None = None):
        self.kind, self.group = kind, group
        self._entries: dict[str, T | str] = {}
        self._plugins_read = group is None

    def add(self, name: str, entry: T | str) -> None:
        if name in self._entries:
            raise HarnessError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry

    def replaced(self, name: str, entry: T) -> "Registry[T]":
        """A copy with ``name``'s entry replaced (a case run again on another of its artifacts)."""
        other: Registry[T] = Registry(self.kind)
        other._entries = {**self._all(), name: entry}
        return other

    def get(self, name: str) -> T:
        entries = self._all()
        if name not in entries:
            raise UnknownNameError(self.kind, name, entries)
        entry = entries[name]
        if isinstance(entry, str):
            entry = entries[name] = import_object(entry)  # type: ignore[assignment]
        return entry  # type: ignore[return-value]

    def names(self) -> list[str]:
        return list(self._all())

    def _all(self) -> dict[str, T | str]:
        if not self._plugins_read:
            self._plugins_read = True
            for point in entry_points(group=self.group):  # type: ignore[arg-type]
                self.add(point.name, point.value)
        return self._entries
