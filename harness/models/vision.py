"""torchvision classifiers with seeded random weights (no weights can be downloaded).

Random weights leave BatchNorm at mean 0 / variance 1, so activations grow block by block
unlike a trained network's. Re-estimating the BatchNorm statistics on a few synthetic batches
(``_recalibrate_batchnorm``) gives activation ranges shaped like a trained model's, which is
what quantization accuracy depends on.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from harness.models.spec import InputSpec, ModelSpec

IMAGENET = InputSpec("input", (4, 3, 224, 224), value_range=(-2.0, 2.0))


def _recalibrate_batchnorm(model: nn.Module, batches: int = 4, batch: int = 8) -> nn.Module:
    generator = torch.Generator().manual_seed(1234)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # cumulative average over the batches below
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.rand((batch, 3, 224, 224), generator=generator) * 4 - 2)
    return model.eval()


def _torchvision(arch: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        torch.manual_seed(0)
        return _recalibrate_batchnorm(getattr(torchvision.models, arch)(weights=None))

    build.__name__ = f"build_{arch}"
    return build


def _spec(name: str, arch: str, slow: bool) -> ModelSpec:
    return ModelSpec(name, [IMAGENET], ["logits"], build=_torchvision(arch), task="classification",
                     calibration="synthetic", slow=slow)


SPECS = [
    _spec("resnet18", "resnet18", slow=False),
    _spec("resnet50", "resnet50", slow=True),
    _spec("resnet101", "resnet101", slow=True),
    _spec("mobilenetv3", "mobilenet_v3_small", slow=False),
]
