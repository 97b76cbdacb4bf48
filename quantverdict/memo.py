"""A small per-process table for what a run makes once and reads many times (modules, reference outputs), and a
sequence of what is read afresh each time it is used (outputs too large to hold together)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence, TypeVar, overload

T = TypeVar("T")


class Memo:
    """A small least-recently-used table: ``get(key, make)`` calls ``make`` on a miss only."""

    def __init__(self, size: int | None = None):
        self.size, self.items = size, OrderedDict[Hashable, Any]()

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = self.items[key] = make()
        if self.size is not None and len(self.items) > self.size:
            self.items.popitem(last=False)
        return value


class Loaded(Sequence[T]):
    """Items each read by its own function when indexed, never held: a ranking reads one layer's outputs at a time
    where a list of them all held a recogniser's 51 layers' 3.5 GB at once."""

    def __init__(self, reads: list[Callable[[], T]]):
        self.reads = reads

    def __len__(self) -> int:
        return len(self.reads)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [read() for read in self.reads[index]]
        return self.reads[index]()
