"""The GPUs the NVIDIA driver lists, and which of them CUDA shows this process, read with nvidia-smi: no CUDA context
is made and torch is not imported.

Asking torch for the GPU imports torch (seconds where no bytecode is installed beside it) and initialises CUDA, in
every process that decides which cases its GPU can run: the controller of a pytest-xdist nightly did so before it
started its workers, though it runs no case (4.9 s of each run's start on a 2 x H200 host). The driver knows each
GPU's name and compute capability, and ``CUDA_VISIBLE_DEVICES`` says which of them CUDA shows. Where that could differ
from CUDA's own answer (GPUs of more than one kind, whose order CUDA chooses; MIG instances; a value read here
otherwise than CUDA reads it; a driver older than the CUDA torch was built for; a torch without CUDA), the caller asks
torch as before (:func:`quantverdict.capabilities.detect`).
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ListedGPU:
    """One GPU as ``nvidia-smi --query-gpu`` lists it."""

    index: int
    uuid: str
    name: str
    compute_capability: tuple[int, int]
    mig: bool  # MIG mode on: CUDA shows its instances, not the GPU


QUERY = "index,uuid,name,compute_cap,mig.mode.current"


def parse_listing(text: str) -> list[ListedGPU] | None:
    """``nvidia-smi --query-gpu=<QUERY> --format=csv,noheader``'s lines, or None where one is not understood (a driver
    too old to report compute capability says ``[N/A]``)."""
    gpus = []
    for line in filter(None, (line.strip() for line in text.splitlines())):
        fields = [field.strip() for field in line.split(",")]
        capability = re.fullmatch(r"(\d+)\.(\d+)", fields[3]) if len(fields) == 5 else None
        if capability is None or not fields[0].isdigit():
            return None
        gpus.append(ListedGPU(int(fields[0]), fields[1], fields[2], (int(capability[1]), int(capability[2])),
                              fields[4] == "Enabled"))
    return gpus


def parse_cuda_version(text: str) -> tuple[int, int] | None:
    """The CUDA version the driver supports, from ``nvidia-smi``'s header (``CUDA Version: 13.0``)."""
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", text)
    return (int(found[1]), int(found[2])) if found else None


def visible(gpus: list[ListedGPU], value: str | None) -> list[ListedGPU] | None:
    """The GPUs CUDA shows under ``CUDA_VISIBLE_DEVICES=value`` (unset: all), in its order; None where the value names
    something read here otherwise than CUDA might (MIG instances, names that are no index or GPU UUID). As CUDA does,
    the list ends at the first entry that names no GPU."""
    if value is None:
        return list(gpus)
    shown: list[ListedGPU] = []
    for entry in (entry.strip() for entry in value.split(",")):
        if entry.isdigit():
            found = [gpu for gpu in gpus if gpu.index == int(entry)]
        elif entry.startswith("GPU-"):
            found = [gpu for gpu in gpus if gpu.uuid.startswith(entry)]
        elif entry in ("", "-1") or re.fullmatch(r"-\d+", entry):
            found = []
        else:
            return None
        if len(found) > 1 or (found and found[0] in shown):  # a prefix of two UUIDs, a GPU named twice: CUDA's call
            return None
        if len(found) != 1:
            break
        shown.append(found[0])
    return shown


def torch_cuda_version() -> tuple[int, int] | None:
    """The CUDA version the installed torch was built for, read from its ``version.py`` without importing torch; None
    for a build without CUDA (CPU, ROCm) or where it is not found."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        found = re.search(r"^cuda\b[^=\n]*=\s*['\"](\d+)\.(\d+)", path.read_text(), re.MULTILINE)
    except OSError:
        return None
    return (int(found[1]), int(found[2])) if found else None


def _nvidia_smi(*arguments: str) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", *arguments], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def listed_gpus() -> list[ListedGPU] | None:
    """Every GPU the driver lists; None where nvidia-smi is absent, fails or answers in a form not understood."""
    text = _nvidia_smi(f"--query-gpu={QUERY}", "--format=csv,noheader")
    return None if text is None else parse_listing(text)


def driver_cuda_version() -> tuple[int, int] | None:
    text = _nvidia_smi()
    return None if text is None else parse_cuda_version(text)


def torch_first_gpu(cuda_visible_devices: str | None) -> tuple[bool, ListedGPU | None]:
    """Whether the driver answers for torch here, and if so the GPU torch's ``cuda:0`` is (None: torch sees none): it
    answers where torch has no CUDA, or where the GPUs CUDA shows are all of one name and capability (so their order
    does not matter), none in MIG mode, and the driver runs the CUDA major version torch was built for."""
    built_for = torch_cuda_version()
    if built_for is None:
        return True, None  # a torch without CUDA sees no GPU
    gpus = listed_gpus()
    shown = None if gpus is None else visible(gpus, cuda_visible_devices)
    if shown is None or any(gpu.mig for gpu in shown):
        return False, None
    if not shown:
        return True, None
    driver = driver_cuda_version()
    if driver is None or built_for[0] > driver[0] or len({(gpu.name, gpu.compute_capability) for gpu in shown}) > 1:
        return False, None
    return True, shown[0]
