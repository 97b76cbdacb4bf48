"""Architectures as data: a JSON-able list of blocks and the torch module it describes.

Hypothesis generates these (``quantverdict.generate.strategies``); a failing one is saved as JSON under
``fixtures/regressions/`` and rebuilt from the file by the ordinary test suite. Every block
keeps the shape it receives or changes it in a way the builder tracks, so any list the
strategies draw is a valid network.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from quantverdict.models.seeded import seeded_init

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "sigmoid": nn.Sigmoid}


@dataclass(frozen=True)
class Architecture:
    """``kind`` is "image" (input [N, C, H, W]) or "tokens" (input [N, T, D])."""

    kind: str
    input_shape: tuple[int, ...]  # without the batch dimension
    blocks: tuple[dict[str, Any], ...]
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "input_shape": list(self.input_shape), "blocks": list(self.blocks),
                           "seed": self.seed, **self.meta}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Architecture":
        data = json.loads(text)
        meta = {k: v for k, v in data.items() if k not in ("kind", "input_shape", "blocks", "seed")}
        return cls(data["kind"], tuple(data["input_shape"]), tuple(data["blocks"]), data["seed"], meta)

    @property
    def digest(self) -> str:
        core = json.dumps([self.kind, self.input_shape, self.blocks, self.seed], sort_keys=True)
        return hashlib.sha256(core.encode()).hexdigest()[:12]

    def layer_count(self) -> int:
        return len(self.blocks)

    def build(self) -> nn.Module:
        """The network, its weights drawn CPU-independently from ``seed``: a shrunk failing example is
        the same model on every runner."""
        layers: list[nn.Module] = []
        shape = list(self.input_shape)
        for block in self.blocks:
            module, shape = _block(block, shape)
            layers.append(module)
        return seeded_init(nn.Sequential(*layers), self.seed).eval()


class _Residual(nn.Module):
    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class _Concat(nn.Module):
    def __init__(self, left: nn.Module, right: nn.Module):
        super().__init__()
        self.left, self.right = left, right

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.left(x), self.right(x)], dim=1)


class _Attention(nn.Module):
    """Single-head softmax attention over tokens."""

    def __init__(self, dim: int):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.scale = dim ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) * self.scale, dim=-1)
        return weights @ self.v(x)


class _Transpose(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous()


def _padding(block: dict[str, Any]) -> int:
    return block.get("padding", block["kernel"] // 2 * block.get("dilation", 1))  # default: "same" at stride 1


def conv_output_size(size: int, block: dict[str, Any]) -> int:
    dilation, stride = block.get("dilation", 1), block.get("stride", 1)
    return (size + 2 * _padding(block) - dilation * (block["kernel"] - 1) - 1) // stride + 1


def _conv(block: dict[str, Any], channels: int) -> nn.Conv2d:
    return nn.Conv2d(channels, block["out"], block["kernel"], stride=block.get("stride", 1), padding=_padding(block),
                     groups=block.get("groups", 1), dilation=block.get("dilation", 1))


def _block(block: dict[str, Any], shape: list[int]) -> tuple[nn.Module, list[int]]:
    kind = block["type"]
    if kind in ACTIVATIONS:
        return ACTIVATIONS[kind](), shape
    if kind == "conv":
        c, h, w = shape
        return _conv(block, c), [block["out"], conv_output_size(h, block), conv_output_size(w, block)]
    if kind == "batchnorm":
        bn = nn.BatchNorm2d(shape[0])
        with torch.no_grad():  # non-trivial statistics, as after training
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
        return bn, shape
    if kind == "pool":
        c, h, w = shape
        pool = nn.MaxPool2d(2) if block["mode"] == "max" else nn.AvgPool2d(2)
        return pool, [c, h // 2, w // 2]
    if kind == "residual_conv":
        c = shape[0]
        body = nn.Sequential(_conv({"out": c, "kernel": 3}, c), nn.ReLU())
        return _Residual(body), shape
    if kind == "concat_conv":
        c, h, w = shape
        return _Concat(_conv({"out": block["out"], "kernel": 1}, c), _conv({"out": block["out"], "kernel": 3}, c)), \
            [2 * block["out"], h, w]
    if kind == "linear":
        return nn.Linear(shape[-1], block["out"]), [*shape[:-1], block["out"]]
    if kind == "layernorm":
        return nn.LayerNorm(shape[-1]), shape
    if kind == "attention":
        return _Residual(_Attention(shape[-1])), shape
    if kind == "transpose":
        return _Transpose(), [shape[1], shape[0]]
    if kind == "head":  # image → logits
        c = shape[0]
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, block["out"])), [block["out"]]
    raise ValueError(f"unknown block type {kind!r}")
