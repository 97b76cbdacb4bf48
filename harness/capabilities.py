"""What this machine can run: the GPU, installed backends, and the precision support matrix.

Every skip in the harness comes from here, phrased as the requirement that failed.
"""
from __future__ import annotations

import functools
import importlib.util
import platform
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version

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


@dataclass(frozen=True)
class Capabilities:
    gpu: GPU | None
    packages: dict[str, str | None] = field(default_factory=dict)
    host: str = ""

    def has(self, package: str) -> bool:
        return self.packages.get(package) is not None

    def gpu_requirement(self, precision: str) -> str | None:
        """Why ``precision`` cannot run on this GPU, or None if it can."""
        if self.gpu is None:
            needed = MIN_COMPUTE_CAPABILITY[precision]
            return f"{precision} needs an NVIDIA GPU (compute capability ≥ {needed[0]}.{needed[1]}); none found"
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


@functools.lru_cache(maxsize=1)
def detect() -> Capabilities:
    """Probe once per process: the first CUDA device through torch, if torch has CUDA."""
    gpu = None
    if package_version("torch") is not None:
        import torch

        if torch.cuda.is_available():
            gpu = GPU(torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0)))  # type: ignore[arg-type]
    return Capabilities(gpu, {name: package_version(name) for name in PACKAGES}, platform.node())
