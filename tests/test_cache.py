"""The artifact cache: content keys, atomic writes, corruption detection, multi-process safety."""
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from quantverdict.cache import Cache, atomic_write_bytes
from quantverdict.hashing import content_hash


def test_content_hash_sees_every_part():
    base = content_hash("k", np.zeros(3, np.float32), {"a": 1, "b": [1, 2]})
    assert base == content_hash("k", np.zeros(3, np.float32), {"b": [1, 2], "a": 1})
    assert base != content_hash("k", np.zeros(3, np.float64), {"a": 1, "b": [1, 2]})
    assert base != content_hash("k", np.zeros((3, 1), np.float32), {"a": 1, "b": [1, 2]})
    assert base != content_hash("k", np.zeros(3, np.float32), {"a": 2, "b": [1, 2]})
    assert content_hash(b"ab", b"c") != content_hash(b"a", b"bc")
    words = np.array(["a", "bc"], dtype=object)  # an ONNX string tensor: hashed by its strings, in any process
    assert content_hash(words) == content_hash(np.array(["a", "bc"], dtype=object).copy())
    assert content_hash(words) != content_hash(np.array(["a", "bd"], dtype=object))


def test_failed_write_leaves_old_file_and_no_temporaries(tmp_path, monkeypatch):
    target = tmp_path / "artifact.bin"
    atomic_write_bytes(target, b"old")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact.bin"]


def test_corrupt_entry_is_moved_aside_and_rebuilt(tmp_path):
    cache = Cache(tmp_path)
    path = cache.get_or_create("onnx", "ab" * 32, ".bin", lambda: b"payload")
    path.write_bytes(b"payl")  # truncated behind the cache's back
    with pytest.warns(UserWarning, match="does not match its checksum"):
        rebuilt = cache.get_or_create("onnx", "ab" * 32, ".bin", lambda: b"payload")
    assert rebuilt.read_bytes() == b"payload"
    assert path.with_name(path.name + ".corrupt").read_bytes() == b"payl"
    assert cache.stats == {"onnx.miss": 2, "onnx.corrupt": 1}


@pytest.mark.parametrize("swap", ["link", "copy"])
def test_an_entry_swapped_for_another_keys_is_not_served(tmp_path, swap):
    """An INT8 outputs entry (artifact and sidecar) replaced by the FP32 entry, as links or as copies: the
    sidecar records the FP32 key, so the INT8 lookup rebuilds instead of serving FP32's numbers as INT8's."""
    import os
    import shutil

    cache = Cache(tmp_path)
    fp32 = cache.get_or_create("outputs", "aa" * 32, ".npz", lambda: b"fp32 outputs")
    int8 = cache.get_or_create("outputs", "bb" * 32, ".npz", lambda: b"int8 outputs")
    for source, target in ((fp32, int8), (fp32.with_name(fp32.name + ".json"), int8.with_name(int8.name + ".json"))):
        target.unlink()
        os.symlink(source, target) if swap == "link" else shutil.copyfile(source, target)
    with pytest.warns(UserWarning, match="does not match its checksum or its key, or is a link"):
        served = cache.get_or_create("outputs", "bb" * 32, ".npz", lambda: b"int8 outputs")
    assert served.read_bytes() == b"int8 outputs" and not served.is_symlink()
    assert fp32.read_bytes() == b"fp32 outputs"  # the link's target is left alone


def test_failed_produce_leaves_no_entry(tmp_path):
    cache = Cache(tmp_path)

    def fail() -> bytes:
        raise ValueError("exporter crashed")

    with pytest.raises(ValueError):
        cache.get_or_create("onnx", "cd" * 32, ".bin", fail)
    assert [p for p in tmp_path.rglob("*") if p.is_file() and "locks" not in p.parts] == []


def _build_once(root: str, counter: str) -> str:
    def produce() -> bytes:
        with open(counter, "a") as handle:
            handle.write("x")
        time.sleep(0.3)
        return b"shared artifact"

    return str(Cache(Path(root)).get_or_create("engine", "ef" * 32, ".bin", produce))


def test_concurrent_workers_build_an_artifact_once(tmp_path):
    counter = tmp_path / "builds.txt"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        paths = pool.starmap(_build_once, [(str(tmp_path / "cache"), str(counter))] * 4)
    assert len(set(paths)) == 1
    assert counter.read_text() == "x"
    assert Path(paths[0]).read_bytes() == b"shared artifact"


KEYS = 40


def _hammer(root: str, seed: int) -> dict:
    """Every key of one cold cache, in this process's own order, each artifact's bytes checked after the
    lookup returns: what two CI jobs sharing a cache volume do, at a higher rate."""
    import hashlib
    import random
    import warnings

    cache, problems = Cache(Path(root)), []
    order = list(range(KEYS))
    random.Random(seed).shuffle(order)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for number in order:
            data = hashlib.sha256(str(number).encode()).digest() * 8192  # 256 KiB per artifact

            def produce() -> bytes:
                time.sleep(0.002)
                return data

            try:
                path = cache.get_or_create("stress", content_hash(number), ".bin", produce)
                if path.read_bytes() != data:
                    problems.append(f"key {number}: other bytes")
            except Exception as exc:  # the failure being tested for: report it, do not stop
                problems.append(f"key {number}: {type(exc).__name__}: {exc}")
    return {"problems": problems, "warnings": [str(w.message) for w in caught], "misses": cache.stats["stress.miss"],
            "corrupt": cache.stats["stress.corrupt"]}


def test_a_folder_is_locked_as_itself_and_excludes_another_holder(tmp_path):
    """A recipe lock's writers lock the folder that holds it: exclusive like a lock file (flock is per open file, so
    a second holder in this process is refused as another process's would be), and nothing is left behind."""
    from quantverdict.cache import file_lock

    with file_lock(tmp_path) as held, file_lock(tmp_path, wait=False) as second:
        assert held and not second
    with file_lock(tmp_path, wait=False) as again:
        assert again
    assert list(tmp_path.iterdir()) == []


def test_processes_on_one_cold_cache_neither_fail_nor_quarantine_good_entries(tmp_path):
    """Four processes build and read the same 40 artifacts at once, 5 rounds on a new cache each: no lookup
    fails, no good entry is moved aside as corrupt, each artifact is built once. (Before the lookup outside
    the lock stopped quarantining, it took an artifact renamed into place before its sidecar for corrupt.)"""
    for round_ in range(5):
        root = tmp_path / f"cache{round_}"
        with multiprocessing.get_context("spawn").Pool(4) as pool:
            outcomes = pool.starmap(_hammer, [(str(root), seed) for seed in range(4)])
        assert [o["problems"] for o in outcomes] == [[]] * 4, outcomes
        assert sum(o["corrupt"] for o in outcomes) == 0 and not any(o["warnings"] for o in outcomes), outcomes
        assert sum(o["misses"] for o in outcomes) == KEYS and not list(root.rglob("*.corrupt"))


def test_two_concurrent_cold_runs_on_one_cache_both_pass(tmp_path):
    import subprocess
    import sys

    run = [sys.executable, "-m", "quantverdict", "run", "--models", "cnn,mlp", "--precisions", "fp32,int8",
           "--backends", "onnxruntime", "--cache-dir", str(tmp_path / "cache")]
    started = [subprocess.Popen([*run, "--report-dir", str(tmp_path / name)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    outputs = [process.communicate(timeout=600) for process in started]
    assert [process.returncode for process in started] == [0, 0], outputs
    assert not any("checksum" in err for _, err in outputs) and not list((tmp_path / "cache").rglob("*.corrupt"))


def test_a_warm_run_reads_every_artifact_and_imports_no_torch(tmp_path):
    """The second `quantverdict run` of the same matrix finds the export, precision graphs, reference,
    semantics and runtime outputs by content key: it builds no module (so, on a CPU-only machine,
    never imports torch, for quantized cases: FP32's elementwise check goes through Polygraphy's
    comparator, which imports torch to ask whether arrays are tensors) and prints the same table."""
    import json
    import subprocess
    import sys

    from quantverdict.capabilities import nvidia_driver_present

    script = ("import runpy, sys; sys.argv = ['quantverdict'] + sys.argv[1:]\n"
              "try:\n    runpy.run_module('quantverdict', run_name='__main__')\nexcept SystemExit as exit:\n"
              "    print('TORCH_IMPORTED' if 'torch' in sys.modules else 'NO_TORCH'); raise\n")
    command = [sys.executable, "-c", script, "run", "--models", "cnn,digits-cnn", "--precisions", "int8,fp8",
               "--backends", "onnxruntime", "--cache-dir", str(tmp_path / "cache"), "--report-dir", str(tmp_path)]
    cold, warm = (subprocess.run(command, capture_output=True, text=True, timeout=600) for _ in range(2))
    assert cold.returncode == warm.returncode == 0, warm.stderr[-2000:]
    table = lambda out: [line for line in out.splitlines() if "onnxruntime" in line]  # noqa: E731
    assert table(warm.stdout) == table(cold.stdout) and len(table(warm.stdout)) == 4
    records = sorted((json.loads(p.read_text()) for p in tmp_path.glob("run-*.json")), key=lambda r: r["started"])
    misses = {k: v for k, v in records[-1]["cache"].items() if k.endswith(".miss")}
    assert misses == {} and records[-1]["cache"]["outputs.hit"] >= 4
    if not nvidia_driver_present():
        assert "NO_TORCH" in warm.stdout and "TORCH_IMPORTED" in cold.stdout


def _aged(cache: Cache, key: str, hours: float, size: int = 1000) -> Path:
    """An entry of ``size`` bytes last used ``hours`` ago."""
    path = cache.get_or_create("precision", key, ".onnx", lambda: b"x" * size)
    past = time.time() - hours * 3600
    for item in (path, path.with_name(path.name + ".json")):
        os.utime(item, (past, past))
    return path


def _entry_bytes(path: Path) -> int:
    return path.stat().st_size + path.with_name(path.name + ".json").stat().st_size


def test_prune_removes_the_least_recently_used_entries_down_to_the_size(tmp_path):
    """Four entries made 5, 4, 3 and 2 hours ago; the oldest is read again (a hit is a use), so the two
    next-oldest go when the cache may keep two; what is removed is rebuilt on its next use."""
    cache = Cache(tmp_path)
    keys = [c * 64 for c in "abcd"]
    paths = [_aged(cache, key, hours) for key, hours in zip(keys, (5, 4, 3, 2))]
    cache.get_or_create("precision", keys[0], ".onnx", lambda: pytest.fail("a hit must not rebuild"))
    result = cache.prune(max_bytes=2 * _entry_bytes(paths[0]))
    assert (result.removed, result.kept) == (2, 2)
    assert [p.exists() for p in paths] == [True, False, False, True]
    assert result.kept_bytes == 2 * _entry_bytes(paths[0]) and result.freed_bytes == result.kept_bytes
    built = []
    cache.get_or_create("precision", keys[1], ".onnx", lambda: built.append(1) or b"x" * 1000)
    assert built == [1]


def test_prune_keeps_what_a_run_may_be_using_and_what_is_being_built(tmp_path):
    """Entries used within the grace period stay whatever the size; an entry whose lock another builder
    holds stays; files the cache did not lay out (Hypothesis's example database) are never touched;
    an old entry's leftovers (a crashed write's temporary, a quarantined copy) go with it."""
    from quantverdict.cache import file_lock

    cache = Cache(tmp_path)
    recent = cache.get_or_create("semantics", "1" * 64, ".npz", lambda: b"r" * 1000)
    building = _aged(cache, "2" * 64, hours=30)
    old = _aged(cache, "3" * 64, hours=30)
    leftovers = [old.with_name(f".{old.name}.abc123.tmp"), old.with_name(old.name + ".corrupt")]
    for item in leftovers:
        item.write_bytes(b"junk")
        os.utime(item, (time.time() - 30 * 3600,) * 2)
    foreign = tmp_path / "hypothesis" / "0123456789abcdef" / "fedcba9876543210"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"example")
    with file_lock(tmp_path / "locks" / "precision" / f"{'2' * 64}.lock"):
        result = cache.prune(max_bytes=0, unused_for_s=24 * 3600)
    assert result.removed == 1 and not old.exists() and not any(item.exists() for item in leftovers)
    assert recent.exists() and building.exists() and foreign.exists()


def test_the_prune_command_reads_sizes_and_days(tmp_path, capsys):
    from quantverdict.run.cli import main

    cache = Cache(tmp_path)
    kept, gone = _aged(cache, "e" * 64, hours=2), _aged(cache, "f" * 64, hours=24 * 15)
    assert main(["prune-cache", "--cache-dir", str(tmp_path), "--unused-days", "14", "--max-size", "1G"]) == 0
    assert kept.exists() and not gone.exists()
    assert "removed 1 artifacts" in capsys.readouterr().out
    assert main(["prune-cache", "--cache-dir", str(tmp_path)]) == 2


def test_a_full_disk_names_the_entry_and_a_killed_writers_temporary_is_cleared(tmp_path, monkeypatch):
    import errno

    from quantverdict import cache as module
    from quantverdict.cache import CacheError

    cache = Cache(tmp_path)
    path = cache.path("onnx", "ab" * 32, ".onnx")
    path.parent.mkdir(parents=True)
    leftover = path.parent / f".{path.name}.x1y2z3.tmp"  # what kill -9 during atomic_write_bytes leaves
    leftover.write_bytes(b"half a graph")

    def full(target: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(module, "atomic_write_bytes", full)
    with pytest.raises(CacheError, match=f"cannot write cache entry {path}: No space left on device"):
        cache.get_or_create("onnx", "ab" * 32, ".onnx", lambda: b"graph")
    assert not leftover.exists()  # the next build of the key removed the dead writer's temporary
