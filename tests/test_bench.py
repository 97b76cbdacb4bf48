"""Timing helpers: statistics and the floor rule (no wall-clock asserts: speed lives in benchmarks)."""
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.bench import Ratio, Timing, interleaved_ratio, time_call


def fake_timing(ms: float) -> Timing:
    return Timing(ms, ms, ms, ms, 1, 1000 / ms)


def test_interleaved_ratio_reports_median_and_spread():
    base = itertools.cycle([10.0, 12.0, 11.0]).__next__
    fast = itertools.cycle([5.0, 4.0, 5.5]).__next__
    ratio = interleaved_ratio(lambda: fake_timing(base()), lambda: fake_timing(fast()), rounds=3)
    assert (ratio.low, ratio.median, ratio.high) == (2.0, 2.0, 3.0)


def test_a_floor_fails_only_when_the_whole_interval_is_below_it():
    assert not Ratio(median=1.9, low=1.7, high=2.1, rounds=5).below(2.0)  # noise straddles the floor
    assert Ratio(median=1.5, low=1.4, high=1.6, rounds=5).below(2.0)


def test_time_call_counts_every_repeat_and_synchronizes_inside():
    calls, syncs = [], []
    timing = time_call(lambda: calls.append(1), items=8, warmup=2, repeats=7, synchronize=lambda: syncs.append(1))
    assert len(calls) == 9 and len(syncs) == 8 and timing.repeats == 7
    assert timing.min_ms <= timing.median_ms <= timing.p90_ms <= timing.p99_ms


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: `harness bench` measures instead")
def test_bench_without_a_gpu_says_so():
    proc = subprocess.run([sys.executable, "-m", "harness", "bench"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: bench measures the GPU lane and needs a CUDA GPU; none found"
