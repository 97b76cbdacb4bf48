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

PACKAGES = ("torch", "torchvision", "onnx", "onnxruntime", "onnxruntime-gpu", "polygraphy",
            "tensorrt", "tensorrt_rtx", "pycuda", "numpy")


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
        needed = MIN_COMPUTE_CAPABILITY[precision]
        if self.gpu is None:
            return f"{precision} needs an NVIDIA GPU (compute capability ≥ {needed[0]}.{needed[1]}); none found"
        if self.gpu.compute_capability < needed:
            return (f"{precision} needs compute capability ≥ {needed[0]}.{needed[1]}; "
                    f"this GPU ({self.gpu.name}) is {self.gpu.cc}")
        return None

    def precision_matrix(self) -> dict[str, str]:
        return {p: (self.gpu_requirement(p) or "supported") for p in MIN_COMPUTE_CAPABILITY}

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["gpu"] = None if self.gpu is None else {"name": self.gpu.name, "compute_capability": self.gpu.cc}
        return data


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
