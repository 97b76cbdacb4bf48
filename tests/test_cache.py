"""The artifact cache: content keys, atomic writes, corruption detection, multi-process safety."""
import multiprocessing
import time
from pathlib import Path

import numpy as np
import pytest

from harness.cache import Cache, atomic_write_bytes, content_hash


def test_content_hash_sees_every_part():
    base = content_hash("k", np.zeros(3, np.float32), {"a": 1, "b": [1, 2]})
    assert base == content_hash("k", np.zeros(3, np.float32), {"b": [1, 2], "a": 1})
    assert base != content_hash("k", np.zeros(3, np.float64), {"a": 1, "b": [1, 2]})
    assert base != content_hash("k", np.zeros((3, 1), np.float32), {"a": 1, "b": [1, 2]})
    assert base != content_hash("k", np.zeros(3, np.float32), {"a": 2, "b": [1, 2]})
    assert content_hash(b"ab", b"c") != content_hash(b"a", b"bc")


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


def test_a_warm_run_reads_every_artifact_and_imports_no_torch(tmp_path):
    """The second `harness run` of the same matrix finds the export, precision graphs, reference,
    semantics and runtime outputs by content key: it builds no module (so, on a CPU-only machine,
    never imports torch, for quantized cases: FP32's elementwise check goes through Polygraphy's
    comparator, which imports torch to ask whether arrays are tensors) and prints the same table."""
    import json
    import subprocess
    import sys

    from harness.capabilities import nvidia_driver_present

    script = ("import runpy, sys; sys.argv = ['harness'] + sys.argv[1:]\n"
              "try:\n    runpy.run_module('harness', run_name='__main__')\nexcept SystemExit as exit:\n"
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
