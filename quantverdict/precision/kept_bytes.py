"""Values kept for the process by bytes (GPTQ's H and its rounded weights): the least recently used go first once
the values' bytes pass a budget, the newest always kept."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")


class KeptBytes(Generic[V]):
    def __init__(self, budget: int, size: Callable[[V], int]):
        self.budget, self.size = budget, size
        self.items: OrderedDict[Hashable, V] = OrderedDict()

    def get(self, key: Hashable) -> V | None:
        """The value kept under ``key`` (now the most recently used), or None."""
        if key not in self.items:
            return None
        self.items.move_to_end(key)
        return self.items[key]

    def put(self, key: Hashable, value: V) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        self.trim()

    def trim(self) -> None:
        """Within the budget again, after a value kept here grew."""
        while len(self.items) > 1 and sum(map(self.size, self.items.values())) > self.budget:
            self.items.popitem(last=False)

    def clear(self) -> None:
        self.items.clear()
