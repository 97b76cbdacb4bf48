"""Shard records (``quantverdict run --shard i/n``, ``pytest --shard i/n``) combined into one run record.

Shards must come from one commit and one runner class, carry the same shard count, each index once,
and no case twice; anything else is refused with the file named (the gate's exit code 2). Cases are put back
where the whole matrix has them (each shard records its cases' places), which restores the unsharded order.
"""
from __future__ import annotations

from collections import Counter
from itertools import zip_longest
from typing import Any, Sequence

from quantverdict.report.load import RecordError
from quantverdict.report.record import summarize
from quantverdict.report.schema import SCHEMA_VERSION, RunRecord


def merge_records(records: Sequence[RunRecord], names: Sequence[str]) -> dict[str, Any]:
    """The shards' records as one record (as it is written: each case as its shard holds it)."""
    for record, name in zip(records, names):
        if not record.shard:
            raise RecordError(f"{name} is not a shard record (no 'shard'; made without --shard i/n)")
    shards = [record.shard for record in records if record.shard]
    counts = {s.count for s in shards}
    if len(counts) != 1:
        raise RecordError(f"shards of different counts: {dict(zip(names, (s.count for s in shards)))}")
    count = counts.pop()
    indexes = Counter(s.index for s in shards)
    missing = sorted(set(range(1, count + 1)) - set(indexes))
    repeated = sorted(i for i, n in indexes.items() if n > 1)
    if missing or repeated:
        raise RecordError(f"shards of {count}: missing {missing or 'none'}, repeated {repeated or 'none'}")
    for key in ("git_commit", "runner_class"):
        values = {getattr(r.environment, key) for r in records}
        if len(values) != 1:
            raise RecordError(f"shards from different {key.replace('_', ' ')}s: "
                              f"{dict(zip(names, (getattr(r.environment, key) for r in records)))}")
    seen: dict[str, str] = {}
    for record, name in zip(records, names):
        for case in record.cases:
            if case.id in seen:
                raise RecordError(f"case {case.id} is in both {seen[case.id]} and {name}")
            seen[case.id] = name
    ordered = sorted(zip(records, shards, names), key=lambda triple: triple[1].index)
    if all(shard.positions for shard in shards):  # each case where the whole matrix has it
        place = {case: position for shard in shards for case, position in shard.positions.items()}
        gaps = sorted(set(range(len(place))) - set(place.values()))
        if gaps or len(place) != sum(len(shard.positions) for shard in shards):
            raise RecordError("the shards do not split one matrix (made from different manifests, selections or "
                              f"--balance-by records): {len(place)} cases, places {gaps[:5] or 'repeated'} "
                              f"{'missing' if gaps else ''}".rstrip())
        found = sorted((case for record in records for case in record.cases), key=lambda case: place.get(case.id, -1))
    else:  # older records: every n-th case, interleaved back
        found = [case for group in zip_longest(*(r.cases for r, _, _ in ordered)) for case in group if case is not None]
    cases = [case.model_dump(exclude_unset=True) for case in found]
    cache: Counter = Counter()
    for record in records:
        cache.update(record.cache)
    return {
        "schema_version": SCHEMA_VERSION,
        "started": min(r.started for r in records),
        "duration_s": max(r.duration_s for r in records),
        "command": ["quantverdict", "merge", *names],
        "environment": records[0].environment.model_dump(exclude_unset=True),
        "merged_from": [{"file": name, **shard.model_dump(exclude={"positions"}), "started": r.started}
                        for r, shard, name in ordered],
        "summary": summarize(cases),
        "cache": dict(cache),
        "cases": cases,
    }
