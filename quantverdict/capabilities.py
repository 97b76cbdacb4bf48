"""What this machine can run: the GPU, the CPU's instruction sets, installed backends, and the
precision support matrix.

Every skip in the harness comes from here, phrased as the requirement that failed. The CPU's
instruction sets matter because ONNX Runtime's fused integer kernels compute differently on them
(without VNNI, 8-bit products are summed in 16-bit intermediates that can saturate): the runner
class they define is recorded with every run, and the gate compares runtimes only within one.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence
from importlib.metadata import PackageNotFoundError, version
from quantverdict.cpuid import cpuid_flags

# Minimum compute capability per precision on NVIDIA GPUs (TensorRT's support matrix).
MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "fp32": (0, 0), "tf32": (8, 0), "fp16": (5, 3), "bf16": (8, 0),
    "int8": (6, 1), "fp8": (8, 9), "fp4": (10, 0),
}

# TensorRT-RTX 1.7: the GPUs its engines run on, and the targets it compiles for ahead of time.
RTX_RUNTIME_CC = ((8, 0), (8, 6), (8, 9), (12, 0), (12, 1))
RTX_BUILD_TARGETS = ((7, 5), (8, 0), (8, 6), (8, 9), (12, 0), (12, 1))

PACKAGES = ("torch", "torchvision", "onnx", "onnxruntime", "onnxruntime-gpu", "polygraphy",
            "tensorrt", "tensorrt-rtx", "pycuda", "numpy")


@dataclass(frozen=True)
class GPU:
    name: str
    compute_capability: tuple[int, int]

    @property
    def cc(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


# Instruction sets that change what integer and low-precision CPU kernels compute or how fast,
# best first: the first one present names the CPU's class.
ISA_CLASSES = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512f", "avx2")
ISA_FLAGS = (*ISA_CLASSES, "avx512_bf16", "avx512_fp16", "amx_bf16", "f16c", "fma")


@dataclass(frozen=True)
class CPU:
    model: str
    isa: tuple[str, ...]  # the flags of ISA_FLAGS this CPU has
    logical_cpus: int
    usable_cpus: int  # this process's CPU affinity

    @property
    def isa_class(self) -> str:
        return next((flag for flag in ISA_CLASSES if flag in self.isa), "baseline")

    @property
    def identity(self) -> list[Any]:
        """What decides a CPU kernel's numbers here: part of the key of cached runtime outputs."""
        return [self.model, list(self.isa), self.usable_cpus]

    @property
    def has_vnni(self) -> bool:
        """8-bit dot products accumulate in 32 bits (AVX-512 VNNI, AVX-VNNI, or AMX)."""
        return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(self.isa))


def detect_cpu() -> CPU:
    """Model name from /proc/cpuinfo; instruction sets as this process can execute them (NumPy's own
    CPUID probe, and :mod:`quantverdict.cpuid` for AVX-VNNI and AMX, which NumPy does not probe: right
    under emulators and containers whose /proc/cpuinfo shows the host), /proc/cpuinfo where neither can."""
    model, listed = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    model = value.strip()
                elif key.strip() == "flags":
                    listed = set(value.split())
                    break
    except OSError:
        pass
    probed = {**(cpuid_flags() or {}), **_numpy_cpu_features()}
    flags = {flag for flag in ISA_FLAGS if probed.get(_NUMPY_NAMES.get(flag, flag), flag in listed)}
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return CPU(model, tuple(f for f in ISA_FLAGS if f in flags), os.cpu_count() or 1, usable)


_NUMPY_NAMES = {"avx2": "AVX2", "avx512f": "AVX512F", "avx512_vnni": "AVX512VNNI", "avx512_bf16": "AVX512BF16",
                "avx512_fp16": "AVX512FP16", "f16c": "F16C", "fma": "FMA3"}


def _numpy_cpu_features() -> dict[str, bool]:
    try:
        from numpy._core._multiarray_umath import __cpu_features__  # NumPy ≥ 2
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_features__  # type: ignore[no-redef]
        except ImportError:
            return {}
    return dict(__cpu_features__)


@dataclass(frozen=True)
class Capabilities:
    gpu: GPU | None
    packages: dict[str, str | None] = field(default_factory=dict)
    host: str = ""
    cpu: CPU | None = None

    @property
    def runner_class(self) -> str:
        """What a runtime's numbers depend on: CPU architecture and instruction-set class, and the GPU."""
        cpu = f"{platform.machine()} {self.cpu.isa_class}" if self.cpu else platform.machine()
        return f"{cpu}; {self.gpu.name if self.gpu else 'no GPU'}"

    @property
    def device(self) -> str:
        """The CPU (and GPU) in words, for messages that name where a runtime ran."""
        if self.cpu is None:
            return platform.machine()
        isa = ", ".join(self.cpu.isa[:4]) or "no AVX2"
        vnni = "" if self.cpu.has_vnni else ", no VNNI"
        return f"{self.cpu.model} ({isa}{vnni})" + (f" + {self.gpu.name}" if self.gpu else "")

    def has(self, package: str) -> bool:
        return self.packages.get(package) is not None

    def gpu_requirement(self, precision: str) -> str | None:
        """Why ``precision`` cannot run on this GPU, or None if it can."""
        if self.gpu is None:
            needed = MIN_COMPUTE_CAPABILITY[precision]
            at_least = f" (compute capability ≥ {needed[0]}.{needed[1]})" if needed > (0, 0) else ""
            return f"{precision} needs an NVIDIA GPU{at_least}; none found"
        return cc_requirement(precision, self.gpu.compute_capability, f"this GPU ({self.gpu.name})")

    def rtx_runtime_requirement(self) -> str | None:
        """Why TensorRT-RTX engines cannot run here, or None."""
        supported = ", ".join(f"{a}.{b}" for a, b in RTX_RUNTIME_CC)
        if self.gpu is None:
            return f"running TensorRT-RTX engines needs a GPU of compute capability {supported}; none found"
        if self.gpu.compute_capability not in RTX_RUNTIME_CC:
            return (f"TensorRT-RTX runs only on compute capability {supported}; "
                    f"this GPU ({self.gpu.name}) is {self.gpu.cc}")
        return None

    def precision_matrix(self) -> dict[str, str]:
        return {p: (self.gpu_requirement(p) or "supported") for p in MIN_COMPUTE_CAPABILITY}

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["gpu"] = None if self.gpu is None else {"name": self.gpu.name, "compute_capability": self.gpu.cc}
        if self.cpu is not None:
            data["cpu"] = {**asdict(self.cpu), "isa": list(self.cpu.isa), "isa_class": self.cpu.isa_class}
        data["runner_class"] = self.runner_class
        return data


def cc_requirement(precision: str, cc: tuple[int, int], subject: str) -> str | None:
    """Why ``precision`` is unsupported at compute capability ``cc`` (of ``subject``), or None."""
    needed = MIN_COMPUTE_CAPABILITY[precision]
    if cc < needed:
        return f"{precision} needs compute capability ≥ {needed[0]}.{needed[1]}; {subject} is {cc[0]}.{cc[1]}"
    return None


def package_version(name: str) -> str | None:
    """Installed version, found without importing the package."""
    try:
        return version(name)
    except PackageNotFoundError:
        module = name.replace("-", "_")
        return "unknown" if importlib.util.find_spec(module) is not None else None


def package_folder(module: str) -> Path | None:
    """Where an installed package's files are (data shipped inside a wheel), found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def nvidia_driver_present() -> bool:
    """An NVIDIA driver is loaded (Linux) or its tool is on PATH: only then can torch see a GPU, so
    only then is torch imported to ask (a second of imports a CPU-only run does not pay)."""
    import shutil

    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


@functools.lru_cache(maxsize=1)
def detect() -> Capabilities:
    """Probe once per process: the first CUDA device torch sees (:func:`first_gpu`), if torch has CUDA."""
    gpu = first_gpu() if package_version("torch") is not None and nvidia_driver_present() else None
    return Capabilities(gpu, {name: package_version(name) for name in PACKAGES}, platform.node(), detect_cpu())


def first_gpu() -> GPU | None:
    """torch's ``cuda:0``: as the driver lists it where that answers for torch
    (:func:`quantverdict.driver.torch_first_gpu`: no CUDA context made, torch not imported), else as torch says."""
    from quantverdict.driver import torch_first_gpu

    answered, listed = torch_first_gpu(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if answered:
        return None if listed is None else GPU(listed.name, listed.compute_capability)
    import torch

    if not torch.cuda.is_available():
        return None
    return GPU(torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0)))  # type: ignore[arg-type]


def pin_worker_gpu(worker: str | None, visible: Sequence[str]) -> str | None:
    """The CUDA_VISIBLE_DEVICES value for pytest-xdist worker ``gwN``: one of the ``visible`` GPUs each (indices or
    UUIDs, as CUDA_VISIBLE_DEVICES lists them), round robin; None where there is one or none, or no xdist."""
    if not worker or not worker.startswith("gw") or len(visible) < 2:
        return None
    return visible[int(worker[2:]) % len(visible)]


def pin_xdist_worker_gpu() -> None:
    """Under pytest-xdist, one GPU per worker (:func:`pin_worker_gpu`) among those CUDA_VISIBLE_DEVICES lists, or
    every GPU of the host where it is unset: a job given two of a host's GPUs (``CUDA_VISIBLE_DEVICES=0,1``) ran every
    worker on the first of them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [str(index) for index in range(gpu_count())] if listed is None else \
        [device.strip() for device in listed.split(",") if device.strip()]
    device = pin_worker_gpu(worker, visible)
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device


def cpus_per_worker() -> int:
    """This process's CPUs, shared with the other processes of a pytest-xdist run, each of which may start threads and
    workers of its own (``pytest -n 16`` on 16 cores started 16 workers each: 256 processes on 16 cores)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    peers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    return max(1, cpus // max(1, int(peers) if peers.isdigit() else 1))


def intra_op_threads() -> int:
    """The threads a library's own pool may take in this process: under pytest-xdist its share of the CPUs
    (:func:`cpus_per_worker`), else 0, the library's default (one per core)."""
    return cpus_per_worker() if os.environ.get("PYTEST_XDIST_WORKER") else 0


def share_cpus_among_xdist_workers() -> None:
    """Under pytest-xdist, PyTorch's OpenMP threads to the worker's share of the CPUs, unless the user set
    ``OMP_NUM_THREADS``: each worker's pool is otherwise one thread per core, and threads that wait for each other
    in spinning barriers on a CPU another worker's threads hold stall them all (the H100 host's 16-core Xeon at
    ``pytest -n 8``: a MobileNetV3 built in 410 s that takes 3 s alone). Set before torch is imported (its
    subprocesses inherit it), and on torch where it was imported already."""
    import sys

    threads = intra_op_threads()
    if threads == 0 or "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


def gpu_count() -> int:
    """GPUs seen by the driver, counted without initialising CUDA in this process."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def physical_memory() -> int | None:
    """This machine's memory in bytes, where the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
