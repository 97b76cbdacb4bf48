"""A matrix split into shards and merged back equals the unsharded run (timings aside); shards and pytest-xdist's
workers spread by the durations an earlier run recorded."""
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from quantverdict.errors import HarnessError
from quantverdict.report.load import RecordError, load_record
from quantverdict.report.merge import merge_records
from quantverdict.run.cases import Case
from quantverdict.run.cli import main
from quantverdict.run.shards import CASE_TIME, Durations, Shard, load_order

REPO = Path(__file__).resolve().parents[1]

RUN = ["run", "--models", "cnn,mlp,digits-cnn", "--precisions", "fp32,int8", "--backends", "onnxruntime"]
TIMING_KEYS = {"timings", "cache", "cost"}  # what a run measures, not what it judged


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
    cases = [Case(f"m{number}", "fp32", "onnxruntime") for number in range(7)]
    assert [[int(c.model[1:]) for c in Shard(i, 3).of(cases).select(cases)] for i in (1, 2, 3)] == \
        [[0, 3, 6], [1, 4], [2, 5]]


def test_shards_balanced_by_recorded_durations_hold_no_more_than_an_even_share_and_one_case():
    """Greedy longest-first: the part that ends last took its last case while it was the least loaded, so no part
    exceeds the even share by more than the longest case; every n-th case can exceed it by much more (here the two
    long cases fall in one part)."""
    seconds = [90, 3, 80, 2, 5, 1, 4, 2, 7, 1, 3, 60]
    cases = [Case(f"m{number}", "int8", "onnxruntime") for number in range(len(seconds))]
    durations = Durations({case.id: time for case, time in zip(cases, seconds)})
    parts = durations.balanced(cases, 3)
    assert sorted(p for part in parts for p in part) == list(range(len(cases))) and all(p == sorted(p) for p in parts)
    loads = [sum(seconds[p] for p in part) for part in parts]
    assert max(loads) <= sum(seconds) / 3 + max(seconds)
    every_third = [sum(seconds[index::3]) for index in range(3)]
    assert max(loads) < max(every_third)
    unknown = Case("new", "int8", "onnxruntime")
    assert durations.of(unknown) == pytest.approx(sum(seconds) / len(seconds))  # a new case: a typical one


def test_shards_by_an_earlier_runs_durations_merge_into_the_unsharded_run(tmp_path):
    """Each case records its wall time; shards chosen by them (not every n-th) merge back in the matrix's order,
    and shards chosen from different records are refused where they do not split one matrix."""
    whole_path = _run(tmp_path, "whole")
    whole = load_record(whole_path)
    assert all(case.timings[CASE_TIME] > 0 for case in whole.cases if case.judged)
    first, second = (_run(tmp_path, n, "--shard", s, "--balance-by", str(whole_path)) for n, s in (("a", "1/2"),
                                                                                                  ("b", "2/2")))
    assert main(["merge", str(second), str(first), "--out", str(tmp_path / "merged.json")]) == 0
    merged = load_record(tmp_path / "merged.json")
    assert [c.id for c in merged.cases] == [c.id for c in whole.cases]
    took = Durations.recorded(whole_path)
    loads = [sum(took.seconds[case] for case in load_record(path).shard.positions) for path in (first, second)]
    assert max(loads) <= sum(took.seconds.values()) / 2 + max(took.seconds.values())
    edited = json.loads(second.read_text())
    edited["shard"]["positions"] = {case: place + 1 for case, place in edited["shard"]["positions"].items()}
    (tmp_path / "moved.json").write_text(json.dumps(edited))
    with pytest.raises(RecordError, match="do not split one matrix"):
        merge_records([load_record(first), load_record(tmp_path / "moved.json")], ["a.json", "moved.json"])


def _xdist_makespan(costs, order, workers, chunk=None):
    """When the last of ``workers`` ends, pytest-xdist's own load scheduler (``--dist load``) handing out cases
    collected in ``order`` (positions into ``costs``, seconds each), each worker running its cases one after another."""
    from xdist.scheduler.load import LoadScheduling

    class Config:
        def getvalue(self, name):
            return [f"{workers}*popen"]

        def getoption(self, name):
            return chunk  # maxschedchunk (None: xdist's default)

    class Node:
        def __init__(self, number):
            self.queue, self.shutting_down = [], False
            self.gateway = type("Gateway", (), {"id": f"gw{number}"})

        def send_runtest_some(self, indices):
            self.queue += indices

        def shutdown(self):
            self.shutting_down = True

    class Quiet:
        def loadsched(self, *said):
            pass

    nodes = [Node(number) for number in range(workers)]
    scheduler = LoadScheduling(Config(), log=Quiet())
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, [str(position) for position in order])
    scheduler.schedule()
    clock = [0.0] * workers
    while any(node.queue for node in nodes):
        worker = min((w for w in range(workers) if nodes[w].queue), key=lambda w: (clock[w] + costs[order[
            nodes[w].queue[0]]], w))
        index = nodes[worker].queue.pop(0)
        clock[worker] += costs[order[index]]
        scheduler.mark_test_complete(nodes[worker], index, costs[order[index]])
    return max(clock)


def test_xdist_load_order_ends_sooner_than_longest_first_under_xdists_own_scheduler():
    """pytest-xdist's load scheduler sends each worker a first chunk of consecutive cases and keeps one queued behind
    the one it runs: collected longest first, one worker got the two longest. Run through that scheduler (xdist's own
    code) on the recorded durations, the order :func:`load_order` gives a GPU nightly's 24 cases over 8 workers
    (seconds measured on 2 × H200) ends sooner than longest first; over 300 drawn matrices (1 to 12 cases a worker,
    2 to 16 workers) each ends within the longest case of an even share (greedy list scheduling's bound), also when
    xdist sends one case at a time (``--maxschedchunk 1``), and together sooner than longest first."""
    nightly = [21.3, 13.2, 17.5, 16.1, 15.2, 14.5, 14.0, 13.4, 12.5, 12.3, 12.1, 11.5, 10.9, 10.4, 10.4, 9.8, 9.8, 9.4,
               9.4, 9.4, 7.6, 7.0, 5.8, 5.5]
    longest = sorted(range(len(nightly)), key=lambda position: -nightly[position])
    assert _xdist_makespan(nightly, load_order(nightly, 8), 8) < _xdist_makespan(nightly, longest, 8)
    ours, theirs = 0.0, 0.0
    for seed in range(300):
        rng = random.Random(seed)
        workers = rng.choice([2, 4, 8, 16])
        costs = [rng.lognormvariate(1.0, rng.choice([0.3, 0.8, 1.5])) for _ in range(rng.randint(1, 12 * workers))]
        order = load_order(costs, workers)
        assert sorted(order) == list(range(len(costs)))
        ends = _xdist_makespan(costs, order, workers)
        assert ends <= sum(costs) / workers + max(costs) + 1e-9, seed
        ours += ends
        theirs += _xdist_makespan(costs, sorted(range(len(costs)), key=lambda position: -costs[position]), workers)
        assert _xdist_makespan(costs, order, workers, 1) <= sum(costs) / workers + max(costs) + 1e-9, seed  # one by one
    assert ours < theirs


@pytest.mark.parametrize("dist", ["load", "loadgroup"])
def test_xdist_workers_take_the_longest_cases_first(tmp_path, dist):
    """With --qv-balance-by, each worker collects the cases longest first, the order xdist hands them out in: one
    worker runs them in that order, which its record keeps; with --dist loadgroup a model's cases run together, the
    model whose cases take longest together first."""
    whole = load_record(_run(tmp_path, "whole"))
    earlier = json.loads(whole.model_dump_json())
    earlier["cases"] = [case for case in earlier["cases"] if case["model"] in ("cnn", "mlp")]
    for case, seconds in zip(earlier["cases"], (1.0, 9.0, 3.0, 5.0)):
        case["timings"] = {CASE_TIME: seconds}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    longest_first = ["cnn-int8-onnxruntime", "mlp-int8-onnxruntime", "mlp-fp32-onnxruntime", "cnn-fp32-onnxruntime"]
    if dist == "loadgroup":  # cnn's 10 s before mlp's 8 s
        longest_first = ["cnn-int8-onnxruntime", "cnn-fp32-onnxruntime", "mlp-int8-onnxruntime", "mlp-fp32-onnxruntime"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "1", "--dist", dist, "-p", "no:cacheprovider",
         "fixtures/models.yaml",
         "--qv-models", "mlp,cnn", "--qv-precisions", "fp32,int8", "--qv-backends", "onnxruntime",
         f"--qv-balance-by={tmp_path / 'earlier.json'}", f"--qv-report-dir={tmp_path / 'xdist'}"],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:]
    [record] = (tmp_path / "xdist").glob("run-*.json")
    assert [case.id for case in load_record(record).cases] == longest_first
