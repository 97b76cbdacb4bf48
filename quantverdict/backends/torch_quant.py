"""Quantized GEMMs executed for real on the GPU: a model's ``nn.Linear`` layers run on low-precision
tensor-core kernels, the rest of the model in FP32 on CUDA (TF32 off).

- FP8 E4M3 through ``torch._scaled_mm``: weights scaled per tensor (``fp8``) or per output
  channel with one activation scale per row of the activation (``fp8-rowwise``), activations
  scaled statically from the harness's calibration;
- INT8 through ``torch._int_mm`` (INT32 accumulation, as TensorRT's), symmetric: weights per
  output channel, activations per tensor from calibration, dequantized in FP32 after the GEMM.

Activation ranges come from the harness's calibrators (:class:`Calibrator` over the same
calibration set the ONNX recipes use), collected at each Linear's input. Only layers called
through ``nn.Linear.forward`` are quantized (attention projections that ``nn.MultiheadAttention``
applies with ``F.linear`` on its own weights are not): the runner reports how many. So this
backend runs its own layer selection, not the precision graph, and is judged against FP32 under
the precision's tolerance; its runtime-fidelity verdict does not apply (``runs_recipe_graph``).
"""
from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np

from quantverdict.backends.base import Artifacts, Backend, Runner
from quantverdict.capabilities import Capabilities
from quantverdict.models.spec import Batch, ModelSpec
from quantverdict.precision.calibrators import Calibrator, Histogram

FP8_MAX, INT8_MAX = 448.0, 127.0
ALIGN = 16  # tensor-core GEMMs need K and N multiples of 16
MIN_INT_MM_ROWS = 32  # torch._int_mm needs more than 16 rows
KERNELS = {"int8": ((8, 0), "torch._int_mm"), "fp8": ((8, 9), "torch._scaled_mm in FP8")}  # precision → (cc, kernel)


def _pad(t: Any, rows: int | None = None, cols: int | None = None) -> Any:
    import torch.nn.functional as F

    pad_rows = 0 if rows is None else rows - t.shape[0]
    pad_cols = 0 if cols is None else cols - t.shape[1]
    return F.pad(t, (0, pad_cols, 0, pad_rows)) if pad_rows or pad_cols else t


def _up(n: int, multiple: int = ALIGN) -> int:
    return -(-n // multiple) * multiple


def _quantize(x: Any, inv_scale: Any, qmax: float, dtype: Any, rounded: bool) -> Any:
    y = (x * inv_scale).clamp(-qmax, qmax)
    return (y.round() if rounded else y).to(dtype)


def _dequantize(acc: Any, scale: Any, bias: Any, dtype: Any) -> Any:
    y = acc.float() * scale
    return (y if bias is None else y + bias).to(dtype)


@functools.lru_cache(maxsize=2)
def _kernels(fused: bool) -> tuple[Any, Any]:
    """The quantize and INT8-dequantize steps; ``fused``: each compiled into one kernel (torch.compile),
    as a deployed engine fuses them, instead of several passes over the activation."""
    if not fused:
        return _quantize, _dequantize
    import torch

    return torch.compile(_quantize, dynamic=False), torch.compile(_dequantize, dynamic=False)


@functools.lru_cache(maxsize=1)
def _quant_linear_class() -> type:
    """Defined on first use, so importing this module imports no torch."""
    import torch
    from torch import nn

    class QuantLinear(nn.Module):
        """One ``nn.Linear`` as a quantized GEMM, scales fixed at construction."""

        def __init__(self, linear: nn.Linear, amax: float, mode: str, out_dtype: Any = None,
                     fused: bool = False) -> None:
            super().__init__()
            self.mode, self.out_features, self.fused = mode, linear.out_features, fused
            self.out_dtype = out_dtype or torch.float32
            weight = _pad(linear.weight.detach().float(), _up(linear.out_features), _up(linear.in_features))  # (N, K)
            self.qmax = INT8_MAX if mode == "int8" else FP8_MAX
            rowwise = mode in ("int8", "fp8-rowwise")
            w_amax = weight.abs().amax(dim=1) if rowwise else weight.abs().amax()
            w_scale = torch.clamp(w_amax, min=1e-12) / self.qmax
            self.register_buffer("w_scale", w_scale.reshape(1, -1) if rowwise else w_scale)
            scaled = weight / (w_scale.reshape(-1, 1) if rowwise else w_scale)
            self.register_buffer("weight_q", torch.round(scaled).clamp(-self.qmax, self.qmax).to(torch.int8)
                                 if mode == "int8" else scaled.clamp(-self.qmax, self.qmax).to(torch.float8_e4m3fn))
            x_scale = max(amax, 1e-12) / self.qmax
            device = linear.weight.device
            self.register_buffer("x_scale", torch.tensor(x_scale, dtype=torch.float32, device=device))
            self.register_buffer("inv_scale", torch.tensor(1.0 / x_scale, dtype=torch.float32, device=device))
            bias = None if linear.bias is None else _pad(linear.bias.detach().float()[None], None,
                                                         _up(linear.out_features))[0]
            self.register_buffer("bias", bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            quantize, dequantize = _kernels(self.fused)
            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            m, k = x2.shape[0], self.weight_q.shape[1]
            if self.mode == "int8":
                xq = _pad(quantize(x2, self.inv_scale, self.qmax, torch.int8, True),
                          MIN_INT_MM_ROWS if m < MIN_INT_MM_ROWS else None, k)
                y = dequantize(torch._int_mm(xq, self.weight_q.t())[:m], self.x_scale * self.w_scale, self.bias,
                               self.out_dtype)
            else:
                xq = _pad(quantize(x2, self.inv_scale, self.qmax, torch.float8_e4m3fn, False), None, k)
                rowwise = self.mode == "fp8-rowwise"
                out = torch.bfloat16 if rowwise or self.out_dtype == torch.bfloat16 else torch.float32
                fuse_bias = self.bias is not None and out == torch.bfloat16  # _scaled_mm adds a bias of its out type
                y = torch._scaled_mm(xq, self.weight_q.t(), bias=self.bias.to(out) if fuse_bias else None,
                                     scale_a=self.x_scale.expand(m, 1).contiguous() if rowwise else self.x_scale,
                                     scale_b=self.w_scale, out_dtype=out)
                y = (y if fuse_bias or self.bias is None else y + self.bias).to(self.out_dtype)
            return y[:, :self.out_features].reshape(*shape[:-1], self.out_features)

    return QuantLinear


def quant_linear(linear: Any, amax: float, mode: str, out_dtype: Any = None, fused: bool = False) -> Any:
    """``linear`` as a quantized GEMM module: ``mode`` int8, fp8 or fp8-rowwise; ``amax``: its input's."""
    return _quant_linear_class()(linear, amax, mode, out_dtype, fused)


def linear_input_amax(module: Any, batches: list[Batch], spec: ModelSpec, calibrator: Calibrator,
                      device: str) -> dict[str, float]:
    """Per ``nn.Linear`` (by module path) the calibrated amax of its input over ``batches``; layers
    that are never called through ``forward`` are absent."""
    import torch
    from torch import nn

    histograms: dict[str, Histogram] = {}
    hooks = []
    for name, layer in module.named_modules():
        if isinstance(layer, nn.Linear):
            def record(_: Any, args: tuple, name: str = name) -> None:
                histograms.setdefault(name, Histogram(calibrator.bins)).add(args[0].detach().float().cpu().numpy())
            hooks.append(layer.register_forward_pre_hook(record))
    try:
        with torch.no_grad():
            for batch in batches:
                module(*[torch.from_numpy(np.ascontiguousarray(batch[i.name])).to(device) for i in spec.inputs])
    finally:
        for hook in hooks:
            hook.remove()
    return {name: calibrator.amax(hist) for name, hist in histograms.items()}


def quantize_linears(module: Any, amax: dict[str, float], mode: str, out_dtype: Any = None,
                     fused: bool = False) -> tuple[Any, int, int]:
    """A copy of ``module`` with each calibrated Linear replaced; (module, quantized, Linear count)."""
    from torch import nn

    model = copy.deepcopy(module)
    linears = [name for name, layer in model.named_modules() if isinstance(layer, nn.Linear)]
    for name in linears:
        if name not in amax:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, quant_linear(getattr(parent, child), amax[name], mode, out_dtype, fused))
    return model, sum(1 for name in linears if name in amax), len(linears)


def module_coverage(module: Any) -> dict[str, Any]:
    """Which of ``module``'s weighted layers this backend runs quantized (its ``nn.Linear`` layers) and which
    stay FP32 (convolutions, and the input and output projections of ``nn.MultiheadAttention``, which
    ``F.linear`` applies), with their weights, in the shape of
    :func:`quantverdict.precision.coverage.layer_coverage`, by module path."""
    from collections import Counter

    from torch import nn

    attention = {name for name, layer in module.named_modules() if isinstance(layer, nn.MultiheadAttention)}
    quantized: dict[str, int] = {}
    left: dict[str, tuple[str, int]] = {}  # name → (kind, weights)
    for name, layer in module.named_modules():
        if name.rpartition(".")[0] in attention:  # out_proj: counted with its attention layer
            continue
        if isinstance(layer, nn.MultiheadAttention):
            left[f"{name}.in_proj"] = ("MultiheadAttention", layer.in_proj_weight.numel()
                                       if layer.in_proj_weight is not None else 3 * layer.embed_dim ** 2)
            left[f"{name}.out_proj"] = ("MultiheadAttention", layer.out_proj.weight.numel())
        elif isinstance(layer, nn.Linear):
            quantized[name] = layer.weight.numel()
        elif isinstance(layer, nn.modules.conv._ConvNd):
            left[name] = (type(layer).__name__, layer.weight.numel())
    kinds: dict[str, list[int]] = {"Linear": [len(quantized), len(quantized)]} if quantized else {}
    for kind, _ in left.values():
        kinds.setdefault(kind, [0, 0])[1] += 1
    reason = "no kernel: torch_quant quantizes the nn.Linear layers called through their forward only"
    return {"layers": len(quantized) + len(left), "quantized": len(quantized), "quantized_layers": sorted(quantized),
            "float_layers": sorted(left), "kinds": dict(sorted(kinds.items())),
            "parameters": {"quantized": sum(quantized.values()),
                           "all": sum(quantized.values()) + sum(size for _, size in left.values()),
                           "deliberately_float": 0},
            "kept": {name: reason for name in sorted(left)}, "missed": {},
            "float_kinds": dict(Counter(kind for kind, _ in left.values()).most_common())}


class TorchQuantRunner(Runner):
    name = "torch_quant"

    def __init__(self, artifacts: Artifacts, mode: str):
        self.artifacts, self.mode = artifacts, mode

    def activate_impl(self) -> None:
        import torch

        spec = self.artifacts.spec
        self._tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        assert self.artifacts.module is not None
        fp32 = copy.deepcopy(self.artifacts.module()).to("cuda").eval()
        calibrator = getattr(self.artifacts.recipe, "calibrator", None) or Calibrator()
        amax = linear_input_amax(fp32, self.artifacts.calibration_batches(), spec, calibrator, "cuda")
        self.model, self.quantized, self.linears = quantize_linears(fp32, amax, self.mode)
        self.calibrator = calibrator

    def infer_impl(self, feed: Batch) -> dict[str, np.ndarray]:
        import torch

        args = [torch.from_numpy(np.ascontiguousarray(feed[i.name])).to("cuda") for i in self.artifacts.spec.inputs]
        with torch.no_grad():
            outputs = self.model(*args)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return {name: out.float().cpu().numpy() for name, out in zip(self.artifacts.spec.outputs, outputs)}

    def deactivate_impl(self) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self._tf32
        del self.model

    def label(self) -> str:
        import torch

        kernel = "torch._int_mm (INT32 accumulation)" if self.mode == "int8" else "torch._scaled_mm (per-tensor scales)"
        return f"torch {torch.__version__} CUDA, nn.Linear layers on {kernel}, the rest FP32"

    def describe(self) -> dict[str, Any]:
        return {"quantized_linears": self.quantized, "linears": self.linears, "mode": self.mode,
                "calibration": self.calibrator.params}


class TorchQuantBackend(Backend):
    """INT8 and FP8 on a CUDA GPU's tensor cores, for models with Linear layers."""

    name = "torch_quant"
    precisions = frozenset(KERNELS)
    gpu_precisions = frozenset(KERNELS)
    runs_recipe_graph = False

    def unavailable(self, caps: Capabilities) -> str | None:
        return None if caps.has("torch") else "torch_quant backend needs PyTorch; not installed"

    def requirement(self, spec: ModelSpec, precision: str, caps: Capabilities) -> str | None:
        if spec.build is None:
            return f"model {spec.name!r} is an ONNX file; torch_quant needs a torch module"
        if caps.gpu is None:
            return f"{precision} on torch_quant runs tensor-core GEMMs on an NVIDIA GPU; none found"
        needed, kernel = KERNELS[precision]
        if caps.gpu.compute_capability < needed:
            return (f"{precision} on torch_quant uses {kernel}, which needs compute capability ≥ {needed[0]}.{needed[1]}; "
                    f"this GPU ({caps.gpu.name}) is {caps.gpu.cc}")
        return None

    def coverage(self, artifacts: Artifacts) -> dict[str, Any] | None:
        return None if artifacts.module is None else module_coverage(artifacts.module())

    def load(self, artifacts: Artifacts) -> Runner:
        return TorchQuantRunner(artifacts, artifacts.recipe.name)  # the mode is the precision: int8 or fp8
