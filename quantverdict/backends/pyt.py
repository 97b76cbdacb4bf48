"""PyTorch backend: the eager model in FP32 anywhere, and TF32/FP16/BF16 on CUDA.

Reduced precisions are offered on CUDA only: PyTorch's CPU half/bfloat16 kernels round
differently from the GPUs models are deployed to (on ResNet-101 they lost 20 dB more SNR
than FP16 storage rounding), so a CPU result would measure PyTorch's CPU, not the model.
"""
from __future__ import annotations

import copy
import weakref
from typing import Any

import numpy as np

from quantverdict.backends.base import Artifacts, Backend, Runner
from quantverdict.capabilities import Capabilities
from quantverdict.models.spec import Batch, ModelSpec

_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_PLACED: "weakref.WeakKeyDictionary[Any, dict[tuple[str, str], Any]]" = weakref.WeakKeyDictionary()


def placed(module: Any, device: str, dtype: Any) -> Any:
    """``module`` on ``device`` in ``dtype``, in eval mode: itself where it is there already, else a copy made once
    per process (the module as built is never changed): a model's reference, FP32 and TF32 runs share one, and a deep
    copy of a ResNet-101 costs most of a second of Python at every activation (7 of a GPU nightly's 42 s)."""
    copies = _PLACED.setdefault(module, {})
    key = (device, str(dtype))
    if key not in copies:
        there = all(p.device.type == device and (not p.is_floating_point() or p.dtype == dtype)
                    for p in [*module.parameters(), *module.buffers()])
        copies[key] = module.eval() if there else copy.deepcopy(module).to(device=device, dtype=dtype).eval()
    return copies[key]


class TorchRunner(Runner):
    name = "torch"

    def __init__(self, module: Any, spec: ModelSpec, precision: str, device: str):
        self.module, self.spec, self.precision, self.device = module, spec, precision, device

    def activate_impl(self) -> None:
        import torch

        self.dtype = getattr(torch, _DTYPES[self.precision])
        self.model = placed(self.module, self.device, self.dtype)
        self._tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        tf32 = self.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32

    def infer_impl(self, feed: Batch) -> dict[str, np.ndarray]:
        import torch

        args = []
        for spec in self.spec.inputs:
            tensor = torch.from_numpy(np.ascontiguousarray(feed[spec.name])).to(self.device)
            args.append(tensor.to(self.dtype) if tensor.is_floating_point() else tensor)
        with torch.no_grad():
            outputs = self.model(*args)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return {name: out.float().cpu().numpy() for name, out in zip(self.spec.outputs, outputs)}

    def deactivate_impl(self) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self._tf32
        del self.model


class TorchBackend(Backend):
    name = "torch"
    precisions = frozenset(_DTYPES)
    gpu_precisions = frozenset({"tf32", "fp16", "bf16"})

    def unavailable(self, caps: Capabilities) -> str | None:
        return None if caps.has("torch") else "torch backend needs PyTorch; not installed"

    def requirement(self, spec: ModelSpec, precision: str, caps: Capabilities) -> str | None:
        if spec.build is None:
            return f"model {spec.name!r} is an ONNX file; the torch backend needs a torch module"
        if precision in self.gpu_precisions or caps.gpu is not None:
            return caps.gpu_requirement(precision)
        return None

    def outputs_key(self, artifacts: Artifacts, caps: Capabilities) -> list[Any] | None:
        """On a CPU-only machine (FP32 only there): the module's build key, torch's version and the
        CPU decide the outputs; a module without a build key, or a GPU, always runs."""
        build_key = artifacts.spec.build_key()
        if caps.gpu is not None or caps.cpu is None or build_key is None:
            return None
        return ["torch", caps.packages.get("torch"), build_key, artifacts.recipe.name, caps.cpu.identity]

    def load(self, artifacts: Artifacts) -> Runner:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        assert artifacts.module is not None
        return TorchRunner(artifacts.module(), artifacts.spec, artifacts.recipe.name, device)
