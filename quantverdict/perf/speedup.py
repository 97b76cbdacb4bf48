"""Speedup floors as data (quantverdict/defaults/speedups.yaml), each checked on an interleaved ratio."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.dataclasses import dataclass

from quantverdict.documents import load
from quantverdict.errors import HarnessError
from quantverdict.judge.workbench import Workbench
from quantverdict.perf.bench import Ratio, Timing, interleaved_ratio, time_call
from quantverdict.gpu_slot import this_gpu, timing_slot
from quantverdict.precision import known_precisions

PrecisionName = Literal[tuple(known_precisions())]  # type: ignore[valid-type]


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class Floor:
    model: str
    backend: str
    hardware: Literal["cpu", "gpu"]
    batch: int
    base: PrecisionName
    fast: PrecisionName
    floor: float
    cpus: int | None = None  # a CPU floor holds for runners of this many logical CPUs only
    isa_class: str | None = None  # ... and of this instruction-set class (CPU.isa_class: avx512_vnni, avx2…)
    target: str = "emulated"  # the graph target of ``fast`` (onnxruntime-cpu: ONNX Runtime's own INT8 layout)

    def skip_reason(self) -> str | None:
        import os

        from quantverdict.capabilities import detect

        if self.hardware == "gpu":
            import torch

            return None if torch.cuda.is_available() else f"{self.id}: a GPU floor needs a CUDA GPU; none found"
        if self.cpus is not None and os.cpu_count() != self.cpus:
            return f"{self.id}: floor measured for {self.cpus}-CPU runners; this machine has {os.cpu_count()}"
        cpu = detect().cpu
        if self.isa_class is not None and (cpu is None or cpu.isa_class != self.isa_class):
            return (f"{self.id}: floor measured on {self.isa_class} runners; this CPU is "
                    f"{cpu.isa_class if cpu else 'unknown'}")
        return None

    @property
    def id(self) -> str:
        target = "" if self.target == "emulated" else f"[{self.target}]"
        runner = f"@{self.isa_class}" if self.isa_class else ""
        return f"{self.model}-{self.fast}{target}-vs-{self.base}-{self.backend}-{self.hardware}{runner}-b{self.batch}"


class FloorFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    floors: list[Floor] = []


def load_floors(path: Path | None = None) -> list[Floor]:
    """The speedup floors (the packaged ones, or ``path``'s in their place)."""
    return load(path, "speedups.yaml", FloorFile, "speedup floors").floors


def _timer(bench: Workbench, floor: Floor, precision: str, target: str = "emulated") -> Callable[[], Timing]:
    spec = bench.spec(floor.model)
    if floor.backend == "torch" and floor.hardware == "gpu":
        from quantverdict.perf.gpu_lane import torch_cuda_timing

        shape = (floor.batch, *spec.inputs[0].shape[1:])

        def on_gpu() -> Timing:
            with timing_slot(this_gpu()):  # the GPU to this loop alone
                return torch_cuda_timing(bench.module(floor.model), precision, shape)

        return on_gpu
    if floor.backend == "onnxruntime" and floor.hardware == "cpu":
        from quantverdict.backends.onnxrt import OnnxRuntimeRunner, integer_kernel_config
        from quantverdict.precision import get_recipe

        path = bench.precision_onnx(floor.model, get_recipe(precision).for_target(target))
        feeds = spec.sample_batches(2, seed=5, batch=floor.batch)

        def timed() -> Timing:
            with OnnxRuntimeRunner(path, ["CPUExecutionProvider"], optimize=True, config=integer_kernel_config()) as runner:
                turn = iter(range(10 ** 9))
                return time_call(lambda: runner.infer(feeds[next(turn) % 2]), items=floor.batch, warmup=1, repeats=5)

        return timed
    raise HarnessError(f"speedup floor {floor.id}: no timing method for {floor.backend} on {floor.hardware}")


def measure(bench: Workbench, floor: Floor, rounds: int = 5) -> Ratio:
    return interleaved_ratio(_timer(bench, floor, floor.base), _timer(bench, floor, floor.fast, floor.target), rounds)
