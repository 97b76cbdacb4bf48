"""Each layer quantized alone, evaluated as written, in worker processes.

Ranking layers (fallback, sensitivity) evaluates one graph per weighted layer, each a copy of the model: 48 for
MiniLM, once for every candidate recipe of a search that keeps layers in FP32. The graphs are independent, so they
run in parallel: as many workers as this process's CPUs (and memory: each holds the prepared graph twice) allow, each
evaluating every n-th layer with ONNX Runtime on one thread. One thread everywhere, in a worker or in this process, so
that a 2-core and a 64-core runner compute the same bits (ONNX Runtime splits a kernel's work by its threads) and
choose the same layers. Workers are fresh interpreters (``python -m``), not forks: a fork of a process holding ONNX
Runtime's and PyTorch's thread pools can hang, and a spawned multiprocessing pool imports the user's main script again.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from quantverdict.cache import atomic_write_bytes
from quantverdict.errors import HarnessError
from quantverdict.judge.semantics import evaluator, unkept_semantics
from quantverdict.models.spec import Batch
from quantverdict.precision.single_layer import LayerGraphs

LAYERS_PER_WORKER = 4  # a worker's start (an interpreter, the prepared graph read) pays for itself over this many
Outputs = dict[str, np.ndarray]


def usable_cpus() -> int:
    """This process's CPUs, shared with the other processes of a pytest-xdist run, which may each start workers
    (``pytest -n 16`` on 16 cores started 16 workers each: 256 processes on 16 cores)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    peers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    return max(1, cpus // max(1, int(peers) if peers.isdigit() else 1))


def worker_count(graph_bytes: int, layers: int) -> int:
    """How many workers evaluate ``layers`` graphs of about ``graph_bytes`` each: one per usable CPU, no more than
    every :data:`LAYERS_PER_WORKER` layers pay for, nor than the memory free holds (four graphs each)."""
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on this platform: the CPUs decide
        free = None
    by_memory = usable_cpus() if free is None else free // (4 * max(graph_bytes, 1))
    return max(1, min(usable_cpus(), layers // LAYERS_PER_WORKER, by_memory))


def each_alone(graphs: LayerGraphs, layers: Sequence[str], batches: list[Batch], label: str) -> dict[str, Outputs]:
    """Each of ``layers`` quantized alone, its graph's outputs on ``batches``; ``label`` names the progress bar."""
    from tqdm import tqdm

    count = worker_count(graphs.prepared.ByteSize(), len(layers))
    with tqdm(total=len(layers), desc=label, unit="layer", leave=False, disable=None) as bar:
        if count == 1:
            found, evaluated_by = {}, evaluator(graphs.prepared)
            for layer in layers:
                found[layer] = unkept_semantics(graphs.graph(layer), batches, 1, evaluated_by)
                bar.update()
            return found
        with tempfile.TemporaryDirectory(prefix="quantverdict-layers-") as folder:
            return _in_workers(Path(folder), graphs, list(layers), batches, count, bar.update)


def _in_workers(folder: Path, graphs: LayerGraphs, layers: list[str], batches: list[Batch], count: int,
                advance: Callable[[int], object]) -> dict[str, Outputs]:
    (folder / "work.pkl").write_bytes(pickle.dumps((graphs, layers, batches), protocol=pickle.HIGHEST_PROTOCOL))
    package = str(Path(__file__).resolve().parents[2])  # this quantverdict, wherever the worker's path points
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")]))}
    logs = [open(folder / f"worker{index}.log", "wb") for index in range(count)]
    workers = [subprocess.Popen([sys.executable, "-m", __name__, str(folder), str(index), str(count), str(os.getpid())],
                                stdout=subprocess.DEVNULL, stderr=log, env=env) for index, log in enumerate(logs)]
    try:
        done = 0
        while any(worker.poll() is None for worker in workers):
            time.sleep(0.2)
            now = len(list(folder.glob("*.out")))
            advance(now - done)
            done = now
        failed = [(index, worker.returncode) for index, worker in enumerate(workers) if worker.returncode]
        if failed:
            index, code = failed[0]
            said = (folder / f"worker{index}.log").read_text(errors="replace").strip().splitlines()
            raise HarnessError(f"a worker evaluating layers quantized alone failed (exit {code}): "
                               f"{said[-1] if said else 'it said nothing'}")
        return {layer: pickle.loads((folder / f"{number}.out").read_bytes()) for number, layer in enumerate(layers)}
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        for log in logs:
            log.close()


def main(folder: Path, index: int, count: int, parent: int) -> None:
    """A worker: every ``count``-th layer from the ``index``-th, each written as ``<number>.out``; it stops where its
    parent is gone (an interrupted run)."""
    graphs, layers, batches = pickle.loads((folder / "work.pkl").read_bytes())
    evaluated_by = evaluator(graphs.prepared)  # Q/DQ pairs add no integer operator: each layer's graph is read alike
    for number in range(index, len(layers), count):
        if os.getppid() != parent:
            return
        outputs = unkept_semantics(graphs.graph(layers[number]), batches, 1, evaluated_by)
        atomic_write_bytes(folder / f"{number}.out", pickle.dumps(outputs, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
