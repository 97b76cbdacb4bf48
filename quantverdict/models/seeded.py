"""Weights that are the same on every machine.

PyTorch's own initialisers run CPU kernels whose rounding differs by instruction set: the same seed
gives other weights on an AVX2 runner than on an AVX-512 one (measured: every built-in, the plain
MLP included), and every number downstream differs with them. Here each parameter is drawn from
NumPy's PCG64 generator, whose integers are the same everywhere, and scaled with correctly rounded
float64 operations, so the weights are bit-identical on any CPU. Statistics that need a forward pass
(BatchNorm re-estimation) are computed in float64 and rounded to float32, so the last bits of the
kernels' sums cannot reach them.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

_NORMS = ("BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm")


def uniform(rng: np.random.Generator, shape: tuple[int, ...], bound: float) -> np.ndarray:
    """Uniform in [-bound, bound) as float32, exact arithmetic from PCG64's 53-bit integers."""
    unit = rng.random(shape)  # (k >> 11) * 2**-53: exact
    return ((2.0 * unit - 1.0) * bound).astype(np.float32)  # exact, one correctly rounded product, one cast


def seeded_init(module: Any, seed: int) -> Any:
    """Every parameter of ``module`` drawn again, CPU-independently: weights of rank ≥ 2 and their
    layer's biases uniform in ±1/√fan_in (PyTorch's default for Linear and Conv), normalisation
    layers at their constant defaults (scale 1, shift 0: already exact). Returns ``module``."""
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for _, layer in sorted(module.named_modules(), key=lambda item: item[0]):
            if type(layer).__name__.startswith(_NORMS):
                continue
            own = sorted(layer.named_parameters(recurse=False), key=lambda item: item[0])
            weights = [p for _, p in own if p.dim() >= 2]
            fan_in = weights[0][0].numel() if weights else None
            for _, parameter in own:
                width = parameter[0].numel() if parameter.dim() >= 2 else fan_in or parameter.numel()
                parameter.copy_(torch.from_numpy(uniform(rng, tuple(parameter.shape), 1.0 / math.sqrt(width))))
    return module


MEAN_GRID_BITS = 20  # a mean is kept to 2**-20 of its channel's standard deviation


def estimate_batchnorm(model: Any, batches: int, shape: tuple[int, ...], low: float, high: float, seed: int) -> Any:
    """BatchNorm running statistics re-estimated over ``batches`` seeded uniform batches (cumulative
    average), computed in float64 and rounded to float32; returns the model in eval mode, float32.

    A mean is snapped to a power-of-two grid of 2**-20 of its channel's standard deviation first: where
    the true mean is 0 by structure (a convolution of a batch-normalised input), float64 gives rounding
    noise of ~1e-16 of the scale, which float32 would keep and which differs by instruction set."""
    import torch
    from torch import nn

    rng = np.random.default_rng(seed)
    norms = [layer for layer in model.modules() if isinstance(layer, nn.modules.batchnorm._BatchNorm)]
    for layer in norms:
        layer.reset_running_stats()
        layer.momentum = None
    model.double().train()
    with torch.no_grad():
        for _ in range(batches):
            x = low + (high - low) * rng.random(shape)  # float64, exact up to one rounding
            model(torch.from_numpy(x))
        for layer in norms:
            mean, var = layer.running_mean.numpy(), layer.running_var.numpy()
            step = np.exp2(np.floor(np.log2(np.sqrt(np.maximum(var, 1e-300)))) - MEAN_GRID_BITS)
            layer.running_mean.copy_(torch.from_numpy(np.round(mean / step) * step + 0.0))  # -0.0 → 0.0
    return model.float().eval()


def weights_hash(module: Any) -> str:
    """SHA-256 of every parameter's and buffer's name, dtype, shape and bytes (signed zeros apart)."""
    import hashlib

    digest = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        array = value.detach().cpu().numpy()
        digest.update(f"{name}:{array.dtype.str}:{array.shape}:".encode() + array.tobytes())
    return digest.hexdigest()
