"""Near-valid documents for property tests: a real document with values replaced anywhere (nulls, strings, NaN,
huge numbers, nested values), the way a hand edit or another tool's writer gets a file almost right."""
from __future__ import annotations

import copy
from typing import Any, Iterator

from hypothesis import strategies as st

VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 6, 10 ** 6), st.integers(min_value=10 ** 400),
                   st.floats(allow_nan=True), st.text(max_size=8), st.lists(st.integers(), max_size=3),
                   st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def changes() -> st.SearchStrategy[list[tuple[int, Any]]]:
    """Up to four (place index, new value) pairs; the index is taken modulo the document's places."""
    return st.lists(st.tuples(st.integers(0, 10 ** 6), VALUES), min_size=1, max_size=4)


def places(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON-like document, depth first (the root's empty path too)."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from places(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from places(value, (*prefix, index))


def mutated(original: Any, edits: list[tuple[int, Any]]) -> Any:
    """A copy of ``original`` with each edit's place set to its value (an edit whose place an earlier edit removed
    is left out)."""
    document = copy.deepcopy(original)
    paths = [path for path in places(original) if path]
    for index, value in edits:
        *parents, last = paths[index % len(paths)]
        node = document
        try:
            for key in parents:
                node = node[key]
            node[last] = value
        except (KeyError, IndexError, TypeError):
            continue
    return document
