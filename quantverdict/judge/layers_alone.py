"""Each layer quantized alone, its Q/DQ as written, in worker processes, kept as its errors against FP32's outputs.

Ranking layers (fallback, sensitivity) evaluates one graph per weighted layer, each a copy of the model: 48 for
MiniLM, once for every candidate recipe of a search that keeps layers in FP32. The graphs are independent, so they
run in parallel: as many workers as this process's CPUs (and memory: each holds the prepared graph twice) allow, each
evaluating every n-th layer with ONNX Runtime on one thread, this process the first of them (it holds the graphs
already: one interpreter fewer to start, and a few layers still split over the CPUs). One thread everywhere, in a
worker or in this process, so that a 2-core and a 64-core runner compute the same bits (ONNX Runtime splits a kernel's
work by its threads) and choose the same layers. Workers are fresh interpreters (``python -m``), not forks: a fork of
a process holding ONNX Runtime's and PyTorch's thread pools can hang, and a spawned multiprocessing pool imports the
user's main script again.
Each layer's graph is evaluated from where it differs from the prepared graph, its float nodes optimised
(:mod:`quantverdict.judge.downstream`), in groups that share one pass of the prepared graph per batch.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from quantverdict import freed_memory
from quantverdict.cache import atomic_write_bytes
from quantverdict.capabilities import cpus_per_worker
from quantverdict.errors import HarnessError, ResourceError
from quantverdict.resources import available_memory, peak_memory_mb, worker_peak
from quantverdict.scratch import work_folder
from quantverdict.export.compat import serialized
from quantverdict.judge.downstream import Group, Reference
from quantverdict.judge.layer_errors import Errors, View
from quantverdict.judge.semantics import AS_WRITTEN, evaluator, unkept_semantics
from quantverdict.models.spec import Batch
from quantverdict.precision.single_layer import LayerGraphs

# what moves their errors' last bits, and what of the outputs they are taken on
CODE = ("quantverdict.judge.layers_alone", "quantverdict.judge.downstream", "quantverdict.judge.layer_errors",
        "quantverdict.judge.detections")
LAYERS_PER_WORKER = 2  # a worker started beside this process (an interpreter, the graphs read) pays off over this many
GROUP_BYTES = 1 << 30  # the downstream graphs a worker holds sessions of at once, sharing one prepared graph's pass
Outputs = dict[str, np.ndarray]


def worker_count(graph_bytes: int, layers: int) -> int:
    """How many workers evaluate ``layers`` graphs of about ``graph_bytes`` each, this process the first: one per
    usable CPU, no more than every :data:`LAYERS_PER_WORKER` layers pay for, nor than the memory free holds (four
    graphs each)."""
    free = available_memory()
    by_memory = cpus_per_worker() if free is None else free // (4 * max(graph_bytes, 1))
    return max(1, min(cpus_per_worker(), layers // LAYERS_PER_WORKER, by_memory))


def group_bytes(workers: int, graph_bytes: int) -> int:
    """How many bytes of downstream graphs each of ``workers`` holds at once: :data:`GROUP_BYTES`, less where half
    the free memory shared among them is less, never under one graph."""
    free = available_memory()
    return max(graph_bytes, min(GROUP_BYTES, GROUP_BYTES if free is None else free // (2 * workers)))


def each_alone(graphs: LayerGraphs, layers: Sequence[str], batches: list[Batch], label: str,
               reference: Outputs, keep: Callable[[str, Errors], object], output_bytes: int = 0,
               views: Mapping[str, View] | None = None) -> None:
    """Each of ``layers`` quantized alone, its graph's outputs on ``batches`` against FP32's ``reference`` there, as
    :class:`Errors` (on what ``views`` read of an output, where they name it) handed to ``keep(layer, errors)``: a few
    floats per sample where each layer's outputs are a copy of the model's (``output_bytes`` of them, held by a worker
    only until its group of layers ends); ``label`` names the progress bar."""
    from tqdm import tqdm

    size = graphs.prepared.ByteSize()
    count = worker_count(size, len(layers))
    with tqdm(total=len(layers), desc=label, unit="layer", leave=False, disable=None) as bar, \
            work_folder("layers") as folder:
        _in_workers(folder, graphs, list(layers), batches, reference, views or {}, count, group_bytes(count, size),
                    output_bytes, bar.update, keep)
        for number, layer in enumerate(layers):
            if number % count:
                keep(layer, pickle.loads((folder / f"{number}.out").read_bytes()))


def evaluate(graphs: LayerGraphs, layers: list[str], numbers: Iterable[int], batches: list[Batch], budget: int,
             done: Callable[[int, Outputs], object], output_bytes: int = 0,
             going: Callable[[], bool] = lambda: True) -> None:
    """The ``numbers``-th of ``layers``, each quantized alone and evaluated on one thread, ``done(number, outputs)``
    for each: from the cut where the prepared graph's Q/DQ run as written, in groups of ``budget`` bytes (their
    graphs and the ``output_bytes`` each one's outputs hold until the group ends); whole where it is evaluated in exact
    integer arithmetic (its integer operators) or the cut does not apply."""
    evaluated_by = evaluator(graphs.prepared)  # Q/DQ pairs add no integer operator: each layer's graph is read alike
    reference = Reference(graphs.prepared) if evaluated_by == AS_WRITTEN else None
    group = Group()

    def whole(number: int) -> None:
        done(number, unkept_semantics(graphs.graph(layers[number]), batches, 1, evaluated_by, floats_optimised=True))

    for number in numbers:
        if not going():
            return
        model = graphs.model(layers[number])
        part = reference.part(model) if reference is not None else None
        if part is None:
            done(number, unkept_semantics(serialized(model), batches, 1, evaluated_by, floats_optimised=True))
            continue
        group.parts.append((number, part))
        if reference is not None and group.size + output_bytes * len(group.parts) >= budget:
            group.evaluate(reference, batches, done, whole)
    if reference is not None and group.parts:
        group.evaluate(reference, batches, done, whole)


def _in_workers(folder: Path, graphs: LayerGraphs, layers: list[str], batches: list[Batch], reference: Outputs,
                views: Mapping[str, View], count: int, budget: int, output_bytes: int,
                advance: Callable[[int], object], keep: Callable[[str, Errors], object]) -> None:
    """Every ``count``-th layer from the first evaluated here and handed to ``keep``, while ``count - 1`` workers
    write each other one's :class:`Errors` to ``folder`` as ``<number>.out``; this process's share stops where a
    worker failed; the errors are taken on what ``views`` read of FP32's ``reference``."""
    if count > 1:
        (folder / "work.pkl").write_bytes(pickle.dumps((graphs, layers, batches, reference, views),
                                                       protocol=pickle.HIGHEST_PROTOCOL))
    package = str(Path(__file__).resolve().parents[2])  # this quantverdict, wherever the worker's path points
    env = {**os.environ, **freed_memory.WORKER_ENVIRONMENT,
           "PYTHONPATH": os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")]))}
    logs = {index: open(folder / f"worker{index}.log", "wb") for index in range(1, count)}
    workers = {index: subprocess.Popen([sys.executable, "-m", __name__, str(folder), str(index), str(count),
                                        str(budget), str(output_bytes), str(os.getpid())],
                                       stdout=subprocess.DEVNULL, stderr=log, env=env) for index, log in logs.items()}
    try:
        done = 0

        def written() -> None:  # the workers' layers ended since last asked, on the progress bar
            nonlocal done
            now = len(list(folder.glob("*.out")))
            advance(now - done)
            done = now

        def here(number: int, outputs: Outputs) -> None:
            keep(layers[number], Errors.of(reference, outputs, views))
            advance(1)
            written()

        evaluate(graphs, layers, range(0, len(layers), count), batches, budget, here, output_bytes,
                 lambda: not any(worker.poll() for worker in workers.values()))
        while any(worker.poll() is None for worker in workers.values()):
            time.sleep(0.2)
            written()
        failed = [(index, worker.returncode) for index, worker in workers.items() if worker.returncode]
        if failed:
            index, code = failed[0]
            if code < 0:  # a signal: the kernel's out-of-memory killer sends SIGKILL
                raise ResourceError(killed(code, count, graphs.prepared.ByteSize()))
            said = (folder / f"worker{index}.log").read_text(errors="replace").strip().splitlines()
            raise HarnessError(f"a worker evaluating layers quantized alone failed (exit {code}): "
                               f"{said[-1] if said else 'it said nothing'}")
        for peak in folder.glob("worker*.peak"):
            worker_peak(float(peak.read_text()))
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        for log in logs.values():
            log.close()


def killed(code: int, workers: int, graph_bytes: int) -> str:
    """Why a worker ended by signal ``-code``, in words a user can act on."""
    import signal

    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    free = available_memory()
    memory = f"{free / 2 ** 30:.1f} GiB available now" if free is not None else "the memory available unknown"
    likely = ("most likely out of memory: the kernel's OOM killer sends it" if name == "SIGKILL"
              else "it was stopped from outside")
    return (f"a worker evaluating layers quantized alone was killed ({name}; {likely}), one of {workers} sharing a "
            f"{graph_bytes / 2 ** 20:.0f} MB graph, {memory}: the search stops here rather than choose among fewer "
            "candidates than another runner would")


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux's ``PR_SET_PDEATHSIG``), and exit now where it
    already has: killed alone, a run left its workers computing for 45 s at 3.3 GB each. Elsewhere the workers stop
    between layers, when they see their parent gone."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def first_to_go() -> None:
    """Have the kernel's out-of-memory killer take this worker before the process it works for (Linux's
    ``oom_score_adj``, which a process may raise for itself): a worker killed is one line naming memory
    (:func:`killed`) and a record entry; the process it works for, which holds the run and evaluates layers too, killed
    is a run that ends with neither."""
    try:
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:  # no such file (not Linux), or not writable here
        pass


def main(folder: Path, index: int, count: int, budget: int, output_bytes: int, parent: int) -> None:
    """A worker: every ``count``-th layer from the ``index``-th, each written as ``<number>.out``; it ends with its
    parent (an interrupted run), and goes first where memory runs out."""
    die_with_parent(parent)
    first_to_go()
    graphs, layers, batches, reference, views = pickle.loads((folder / "work.pkl").read_bytes())

    def done(number: int, outputs: Outputs) -> None:
        atomic_write_bytes(folder / f"{number}.out", pickle.dumps(Errors.of(reference, outputs, views),
                                                                  protocol=pickle.HIGHEST_PROTOCOL))

    evaluate(graphs, layers, range(index, len(layers), count), batches, budget, done, output_bytes,
             lambda: os.getppid() == parent)
    atomic_write_bytes(folder / f"worker{index}.peak", str(peak_memory_mb()).encode())


if __name__ == "__main__":
    main(Path(sys.argv[1]), *map(int, sys.argv[2:7]))
