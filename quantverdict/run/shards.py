"""How a run's cases are spread: CI shards (part i of n), balanced by the durations an earlier run recorded
(pytest-split's approach: longest first, each to the shard with least so far), and pytest-xdist's workers given the
longest cases first, so that no worker starts a long case while the others have finished. A case the record does
not hold is priced at the mean of those it does (a new model is as long as a typical one)."""
from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from quantverdict.errors import HarnessError
from quantverdict.run.cases import Case

CASE_TIME = "case_s"  # the timings key of a case's whole wall time (Pipeline.run); older records: their stages' sum


@dataclass(frozen=True)
class Durations:
    """Seconds each case took, by case id."""

    seconds: Mapping[str, float]

    @classmethod
    def recorded(cls, path: Path) -> "Durations":
        """The durations in the run record at ``path`` (a whole run's, a shard's or a merged one)."""
        from quantverdict.report.load import load_record

        record = load_record(path)
        return cls({case.id: case.timings.get(CASE_TIME, sum(case.timings.values())) for case in record.cases})

    @functools.cached_property
    def typical(self) -> float:
        """What a case the record does not hold is priced at: the mean of those it does (1 s where it holds none)."""
        return sum(self.seconds.values()) / len(self.seconds) if self.seconds else 1.0

    def of(self, case: Case) -> float:
        return self.seconds.get(case.id, self.typical)

    def longest_first(self, cases: Sequence[Case], together: Callable[[Case], str] | None = None) -> list[int]:
        """The positions of ``cases``, longest first (ties in matrix order); where ``together`` names the group each
        case runs in (one worker runs a group), the longest group first, and in it the longest case."""
        group: dict[str, float] = {}
        for case in cases:
            name = together(case) if together else case.id
            group[name] = group.get(name, 0.0) + self.of(case)
        return sorted(range(len(cases)), key=lambda position: (
            -group[together(cases[position]) if together else cases[position].id], -self.of(cases[position])))

    def balanced(self, cases: Sequence[Case], count: int) -> list[list[int]]:
        """``count`` parts of the positions of ``cases``, each in matrix order: longest first, each to the part with
        the least time so far (the lowest-numbered among equals), which keeps the longest part within the longest
        case of the shortest."""
        parts: list[list[int]] = [[] for _ in range(count)]
        loads = [(0.0, part) for part in range(count)]
        for position in self.longest_first(cases):
            load, part = heapq.heappop(loads)
            parts[part].append(position)
            heapq.heappush(loads, (load + self.of(cases[position]), part))
        return [sorted(part) for part in parts]


@dataclass(frozen=True)
class Shard:
    """Part ``index`` of ``count`` of a run (1-based), and where its cases stand in the whole matrix (by case id),
    which restores the unsharded order when shards are merged (:mod:`quantverdict.report.merge`): every count-th
    case, or, given the durations an earlier run recorded, parts balanced by them."""

    index: int
    count: int
    positions: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "Shard":
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise HarnessError(f"--shard {text!r}: expected i/n, e.g. 2/4") from None
        if not 1 <= index <= count:
            raise HarnessError(f"--shard {text!r}: i must be between 1 and n")
        return cls(index, count)

    def of(self, cases: Sequence[Case], durations: Durations | None = None) -> "Shard":
        """This part of ``cases``: every count-th, or the part of those balanced by ``durations``."""
        chosen = range(self.index - 1, len(cases), self.count) if durations is None else \
            durations.balanced(cases, self.count)[self.index - 1]
        return replace(self, positions={cases[position].id: position for position in chosen})

    def select(self, cases: Sequence[Case]) -> list[Case]:
        return [case for case in cases if case.id in self.positions]

    def to_dict(self) -> dict[str, int | dict[str, int]]:
        return {"index": self.index, "count": self.count, "positions": dict(self.positions)}


def shard_of(text: str | None, recorded: Path | None, cases: Sequence[Case]) -> Shard | None:
    """The part of ``cases`` that ``--shard i/n`` names (None where none is named): balanced by the durations in the
    run record ``recorded`` where one is given, else every n-th case."""
    return _part(text, None if recorded is None else Durations.recorded(recorded), cases)


def _part(text: str | None, durations: Durations | None, cases: Sequence[Case]) -> Shard | None:
    return Shard.parse(text).of(cases, durations) if text else None


def in_order(cases: Sequence[Case], shard: str | None, balance_by: Path | None, distributed: bool,
             by_model: bool) -> list[Case]:
    """The cases of ``--shard`` (every case where none is named) in the order to run them: in a pytest-xdist worker
    (``distributed``) with ``--qv-balance-by``, the longest first, or with ``--dist loadgroup`` (``by_model``: a model's
    cases run on one worker, sharing its module, reference and data) the models whose cases take longest together:
    xdist hands a free worker the next in this order, so a long case never starts last."""
    durations = None if balance_by is None else Durations.recorded(balance_by)  # read once for both uses
    part = _part(shard, durations, cases)
    chosen = part.select(cases) if part else list(cases)
    if not (distributed and durations):
        return chosen
    order = durations.longest_first(chosen, (lambda case: case.model) if by_model else None)
    return [chosen[position] for position in order]
