"""A small name → object registry with lazy ``"module:attr"`` entries and typo suggestions."""
from __future__ import annotations

import importlib
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
    """Holds objects or lazy references to them under unique names."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T | str] = {}

    def add(self, name: str, entry: T | str) -> None:
        if name in self._entries:
            raise HarnessError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise UnknownNameError(self.kind, name, self._entries)
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = self._entries[name] = import_object(entry)  # type: ignore[assignment]
        return entry  # type: ignore[return-value]

    def names(self) -> list[str]:
        return list(self._entries)
