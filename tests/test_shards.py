"""A matrix split into shards and merged back equals the unsharded run (timings aside)."""
import pytest

from quantverdict.errors import HarnessError
from quantverdict.report.load import RecordError, load_record
from quantverdict.report.merge import merge_records
from quantverdict.run.cases import Shard
from quantverdict.run.cli import main

RUN = ["run", "--models", "cnn,mlp,digits-cnn", "--precisions", "fp32,int8", "--backends", "onnxruntime"]
TIMING_KEYS = {"timings", "cache"}


def _run(tmp_path, name, *extra):
    assert main([*RUN, *extra, "--report-dir", str(tmp_path / name)]) == 0
    [path] = (tmp_path / name).glob("run-*.json")
    return path


def _without_timings(case):
    return case.model_dump(exclude=TIMING_KEYS)


def test_two_shards_merge_into_the_unsharded_run(tmp_path):
    whole = load_record(_run(tmp_path, "whole"))
    first, second = _run(tmp_path, "a", "--shard", "1/2"), _run(tmp_path, "b", "--shard", "2/2")
    assert main(["merge", str(second), str(first), "--out", str(tmp_path / "merged.json")]) == 0
    merged = load_record(tmp_path / "merged.json")
    assert [c.id for c in merged.cases] == [c.id for c in whole.cases]
    assert [_without_timings(c) for c in merged.cases] == [_without_timings(c) for c in whole.cases]
    assert merged.summary == whole.summary and [m["index"] for m in merged.model_extra["merged_from"]] == [1, 2]


def test_shards_of_other_commits_or_overlapping_cases_are_refused(tmp_path):
    first, second = (load_record(_run(tmp_path, n, "--shard", s)) for n, s in (("a", "1/2"), ("b", "2/2")))
    other = second.model_copy(deep=True)
    other.environment.git_commit = "0" * 40
    with pytest.raises(RecordError, match="different git commits"):
        merge_records([first, other], ["a.json", "b.json"])
    overlapping = second.model_copy(deep=True)
    overlapping.cases.append(first.cases[0])
    with pytest.raises(RecordError, match=f"case {first.cases[0].id} is in both a.json and b.json"):
        merge_records([first, overlapping], ["a.json", "b.json"])
    with pytest.raises(RecordError, match=r"missing \[2\]"):
        merge_records([first], ["a.json"])


def test_a_bad_shard_is_named():
    with pytest.raises(HarnessError, match="--shard '3/2'"):
        Shard.parse("3/2")
    assert [s.select(list(range(7))) for s in (Shard(1, 3), Shard(2, 3), Shard(3, 3))] == [[0, 3, 6], [1, 4], [2, 5]]
