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


def in_order(cases: Sequence[Case], shard: str | None, balance_by: Path | None, workers: int,
             by_model: bool) -> list[Case]:
    """The cases of ``--shard`` (every case where none is named) in the order to run them: with ``--qv-balance-by``
    under ``workers`` pytest-xdist workers (0: none), as :func:`load_order` hands them out, or with ``--dist
    loadgroup`` (``by_model``: a model's cases run on one worker, sharing its module, reference and data) the models
    whose cases take longest together first: so a long case never starts last."""
    durations = None if balance_by is None else Durations.recorded(balance_by)  # read once for both uses
    part = _part(shard, durations, cases)
    chosen = part.select(cases) if part else list(cases)
    if not (workers and durations):
        return chosen
    order = durations.longest_first(chosen, lambda case: case.model) if by_model else \
        load_order([durations.of(case) for case in chosen], workers)
    return [chosen[position] for position in order]


def xdist_workers() -> int:
    """How many workers the pytest-xdist run this process works in has (0: it is no worker)."""
    import os

    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0) if os.environ.get("PYTEST_XDIST_WORKER") else 0


def load_order(costs: Sequence[float], workers: int) -> list[int]:
    """The positions of cases costing ``costs`` seconds in the order to collect them for ``workers`` pytest-xdist
    workers under ``--dist load`` (xdist's default chunk sizes), whose scheduler hands each worker a first chunk of
    consecutive cases (two each where there are twice as many cases as workers, else one at a time round robin),
    then, as a worker ends one, more from the front, keeping one queued behind the case it runs. Longest first, a
    first chunk gave one worker the two longest cases (a nightly's ViT: 21 s and 13 s, the others 6 to 16 s). The
    order here is that scheduler run on the recorded costs: the first chunks hold the longest cases, each given to the
    worker with the least so far, and each later send takes the longest left."""
    left = sorted(range(len(costs)), key=lambda position: -costs[position])  # ties in matrix order
    if workers < 2 or not left:
        return left
    total = len(left)
    chunk = 1 if total < 2 * workers else max(total // workers // 4, 2)
    owners = [slot % workers for slot in range(total)] if chunk == 1 else \
        [slot // chunk for slot in range(chunk * workers)]  # the worker each of the first sends goes to
    queues: list[list[int]] = [[] for _ in range(workers)]
    loads, slots = [0.0] * workers, [owners.count(worker) for worker in range(workers)]
    for position in left[:len(owners)]:  # each to the worker with the least so far that has a slot left
        worker = min((w for w in range(workers) if slots[w] > len(queues[w])), key=lambda w: (loads[w], w))
        queues[worker].append(position)
        loads[worker] += costs[position]
    taken = [0] * workers
    order = []
    for worker in owners:
        order.append(queues[worker][taken[worker]])
        taken[worker] += 1
    left = left[len(owners):]
    running = [(costs[queue[0]], worker) for worker, queue in enumerate(queues) if queue]
    heapq.heapify(running)
    while left and running:  # a worker ends its case, and is sent more where few are queued (xdist's check_schedule)
        now, worker = heapq.heappop(running)
        queue = queues[worker]
        ended = costs[queue.pop(0)]
        low, high = max(2, len(left) // workers // 4), max(2, len(left) // workers // 2)
        if len(queue) < low and not (ended >= 0.1 and len(queue) >= 2):
            sent, left = left[:high - len(queue)], left[high - len(queue):]
            order += sent
            queue += sent
        if queue:
            heapq.heappush(running, (now + costs[queue[0]], worker))
    return order + left
