"""A small per-process table for what a run makes once and reads many times (modules, reference outputs)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable


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
