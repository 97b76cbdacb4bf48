"""Hypothesis strategies: random architectures (consistent shapes by construction) and inputs.

Public façade: ``architectures``, ``quantizable_layers``, ``input_batches``, ``DISTRIBUTIONS``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from quantverdict.generate.arch import ACTIVATIONS, Architecture, conv_output_size

__all__ = ["DISTRIBUTIONS", "Inputs", "architectures", "input_batches", "quantizable_layers"]

DISTRIBUTIONS = ("uniform", "outliers", "all_negative", "near_zero", "wide_range")
MAX_CHANNELS = 12


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def _conv(draw: Any, channels: int) -> dict[str, Any]:
    groups = draw(st.sampled_from(_divisors(channels)))
    out = groups * draw(st.integers(1, max(1, MAX_CHANNELS // groups)))
    kernel, dilation = draw(st.sampled_from([1, 3, 5])), draw(st.sampled_from([1, 2]))
    return {"type": "conv", "out": out, "kernel": kernel, "stride": draw(st.sampled_from([1, 2])), "groups": groups,
            "dilation": dilation, "padding": draw(st.integers(0, kernel // 2 * dilation))}


@st.composite
def _image_blocks(draw: Any, shape: list[int], count: int) -> list[dict[str, Any]]:
    blocks = []
    for _ in range(count):
        c, h, _ = shape
        kind = draw(st.sampled_from(["conv", "activation", "batchnorm", "residual_conv", "concat_conv"]
                                    + (["pool"] if h >= 4 else [])))
        if kind == "conv":
            block = draw(_conv(c))
            size = conv_output_size(h, block)
            if size < 1:
                continue  # the kernel no longer fits: draw the next block instead
            shape = [block["out"], size, size]
        elif kind == "activation":
            block = {"type": draw(st.sampled_from(sorted(ACTIVATIONS)))}
        elif kind == "pool":
            block = {"type": "pool", "mode": draw(st.sampled_from(["max", "avg"]))}
            shape = [c, h // 2, h // 2]
        elif kind == "concat_conv":
            block = {"type": "concat_conv", "out": draw(st.integers(1, MAX_CHANNELS // 2))}
            shape = [2 * block["out"], h, h]
        else:
            block = {"type": kind}
        blocks.append(block)
    return blocks


@st.composite
def _token_blocks(draw: Any, shape: list[int], count: int) -> list[dict[str, Any]]:
    blocks = []
    for _ in range(count):
        kind = draw(st.sampled_from(["linear", "activation", "layernorm", "attention", "transpose"]))
        if kind == "linear":
            block = {"type": "linear", "out": draw(st.integers(2, 16))}
            shape = [shape[0], block["out"]]
        elif kind == "activation":
            block = {"type": draw(st.sampled_from(sorted(ACTIVATIONS)))}
        elif kind == "transpose":
            block = {"type": "transpose"}
            shape = [shape[1], shape[0]]
        else:
            block = {"type": kind}
        blocks.append(block)
    return blocks


@st.composite
def architectures(draw: Any, max_blocks: int = 5) -> Architecture:
    """An image or token network of 1 to ``max_blocks`` blocks."""
    count = draw(st.integers(1, max_blocks))
    seed = draw(st.integers(0, 2 ** 16))
    if draw(st.booleans()):
        size = draw(st.sampled_from([8, 12, 16]))
        shape = [draw(st.integers(1, 4)), size, size]
        blocks = draw(_image_blocks(list(shape), count))
        if draw(st.booleans()):
            blocks.append({"type": "head", "out": draw(st.integers(2, 10))})
        return Architecture("image", tuple(shape), tuple(blocks), seed)
    shape = [draw(st.integers(2, 8)), draw(st.integers(2, 16))]
    return Architecture("tokens", tuple(shape), tuple(draw(_token_blocks(list(shape), count))), seed)


@st.composite
def quantizable_layers(draw: Any) -> Architecture:
    """One Conv2d (random kernel/stride/groups/dilation) or Linear, optionally followed by an activation."""
    seed = draw(st.integers(0, 2 ** 16))
    tail = [{"type": draw(st.sampled_from(sorted(ACTIVATIONS)))}] if draw(st.booleans()) else []
    if draw(st.booleans()):
        channels, size = draw(st.integers(1, 8)), draw(st.sampled_from([9, 12]))  # ≥ the widest dilated kernel
        return Architecture("image", (channels, size, size), (draw(_conv(channels)), *tail), seed)
    tokens, features = draw(st.integers(1, 6)), draw(st.integers(2, 32))
    return Architecture("tokens", (tokens, features), ({"type": "linear", "out": draw(st.integers(1, 16))}, *tail), seed)


class Inputs:
    """A reproducible batch: distribution, batch size and seed (what a regression file stores)."""

    def __init__(self, distribution: str, batch: int, seed: int):
        self.distribution, self.batch, self.seed = distribution, batch, seed

    def to_dict(self) -> dict[str, Any]:
        return {"distribution": self.distribution, "batch": self.batch, "seed": self.seed}

    def array(self, shape: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        size = (self.batch, *shape)
        if self.distribution == "uniform":
            x = rng.uniform(-1, 1, size)
        elif self.distribution == "outliers":
            x = rng.normal(0, 1, size)
            flat = x.reshape(-1)
            flat[rng.choice(flat.size, max(1, flat.size // 200), replace=False)] *= 50
        elif self.distribution == "all_negative":
            x = -rng.uniform(0.01, 2, size)
        elif self.distribution == "near_zero":
            x = rng.normal(0, 1e-3, size)
        else:  # wide_range: magnitudes log-uniform over six decades
            x = rng.choice([-1, 1], size) * 10.0 ** rng.uniform(-4, 2, size)
        return x.astype(np.float32)

    def __repr__(self) -> str:
        return f"Inputs({self.distribution!r}, batch={self.batch}, seed={self.seed})"


def input_batches() -> st.SearchStrategy[Inputs]:
    """Dynamic batch (1–4) and the value distributions that matter for quantization."""
    return st.builds(Inputs, st.sampled_from(DISTRIBUTIONS), st.integers(1, 4), st.integers(0, 2 ** 16))
