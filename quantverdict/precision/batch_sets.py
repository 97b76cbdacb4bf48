"""Statistics of several overlapping sets of calibration batches measured in one pass over the batches they hold.

A recipe search calibrates each candidate on every fold (three quarters of the calibration set each) and the recipe it
chooses on the whole set: five sets, four of which hold any one batch. Measured one set at a time, every statistic
(ranges, channel ranges, GPTQ's H) runs each batch through the graph four times. While a search runs it names its sets
(:func:`planned`); a statistic of a graph asked of a second of them is then measured for all the others at once
(:func:`siblings`), one forward pass per batch, each set's accumulated from its own batches in its own order: the same
value, bit for bit, as measured alone. The first is measured alone: a graph prepared from one fold's statistics
(SmoothQuant, equalization) is asked of that fold only.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from quantverdict.hashing import content_hash
from quantverdict.models.spec import Batch


@dataclass(eq=False)  # a group is itself, whatever another holds
class _Group:
    sets: list[tuple[list[str], list[Batch]]]  # each set's batches' hashes, and its batches
    graphs: set[str] = field(default_factory=set)  # the graphs a statistic was asked of, of one of the sets


_PLANNED: list[_Group] = []


def batch_keys(batches: Sequence[Batch]) -> list[str]:
    """Each batch's content key: a :func:`planned` set's as hashed when it was planned where ``batches`` are that set's
    own batch objects (a search's statistics ask of its sets hundreds of times, 1.4 GB of hashing for MobileNetV2's),
    else hashed now."""
    for group in reversed(_PLANNED):
        for members, held in group.sets:
            if len(held) == len(batches) and all(mine is theirs for mine, theirs in zip(held, batches)):
                return list(members)
    return [content_hash(batch) for batch in batches]


def batches_hash(batches: Sequence[Batch]) -> str:
    """The content key of a set of batches, from each one's (:func:`batch_keys`)."""
    return content_hash(batch_keys(batches))


@contextmanager
def planned(sets: Sequence[Sequence[Batch]]) -> Iterator[None]:
    """While inside, a statistic of one graph asked of a second of ``sets`` is measured for all the others in the same
    pass (:func:`siblings`)."""
    group = _Group([(batch_keys(batches), list(batches)) for batches in sets])
    _PLANNED.append(group)
    try:
        yield
    finally:
        _PLANNED.remove(group)


def siblings(batches: Sequence[Batch], graph: str, shared: bool = False) -> list[list[Batch]]:
    """The sets to measure ``graph``'s statistic of (``graph``: the hash of what it is measured on) together with
    ``batches`` (itself first): the other sets of a :func:`planned` group that holds it where the statistic of
    ``graph`` was asked of one of them before, or is ``shared`` (a graph every set's statistic is asked of: the
    unprepared graph), or ``batches`` alone."""
    if _PLANNED:
        keys = batch_keys(batches)
        for group in reversed(_PLANNED):
            if any(members == keys for members, _ in group.sets):
                if graph not in group.graphs and not shared:
                    group.graphs.add(graph)
                    break
                return [list(batches), *(others for members, others in group.sets if members != keys)]
    return [list(batches)]


def union(sets: Sequence[Sequence[Batch]]) -> tuple[list[Batch], list[list[int]]]:
    """The distinct batches of ``sets`` in an order each set's batches keep, and for each, which sets hold it (by
    index): one pass over them meets each set's own batches in its order. Where sets' orders disagree, a batch is listed
    (and measured) again, which keeps every set's order."""
    order: list[Batch] = []
    holders: list[list[int]] = []
    keys: list[str] = []
    for number, batches in enumerate(sets):
        members, position = batch_keys(batches), 0
        for index, (key, batch) in enumerate(zip(members, batches)):
            found = next((at for at in range(position, len(keys)) if keys[at] == key), None)
            if found is None:  # placed before the next of this set's batches already listed, or last
                found = next((at for later in members[index + 1:] for at in range(position, len(keys))
                              if keys[at] == later), len(keys))
                keys.insert(found, key)
                order.insert(found, batch)
                holders.insert(found, [])
            holders[found].append(number)
            position = found + 1
    return order, holders
