"""torchvision classifiers with seeded random weights (no weights can be downloaded).

Random weights leave BatchNorm at mean 0 / variance 1, so activations grow block by block
unlike a trained network's. Re-estimating the BatchNorm statistics on a few synthetic batches
(``_recalibrate_batchnorm``) gives activation ranges shaped like a trained model's, which is
what quantization accuracy depends on.
"""
from __future__ import annotations

from typing import Any

from quantverdict.models.spec import InputSpec, ModelSpec, Ref

IMAGENET = InputSpec("input", (4, 3, 224, 224), value_range=(-2.0, 2.0))


def _recalibrate_batchnorm(model: Any, batches: int = 4, batch: int = 8) -> Any:
    import torch
    from torch import nn

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


def build_torchvision(arch: str) -> Any:
    """torchvision's ``arch`` with seeded random weights and re-estimated BatchNorm statistics."""
    import torch
    import torchvision

    torch.manual_seed(0)
    return _recalibrate_batchnorm(getattr(torchvision.models, arch)(weights=None))


def _spec(name: str, arch: str, slow: bool) -> ModelSpec:
    return ModelSpec(name, [IMAGENET], ["logits"], build=Ref("quantverdict.models.vision:build_torchvision", (arch,)),
                     task="classification", calibration="synthetic", slow=slow)


SPECS = [
    _spec("resnet18", "resnet18", slow=False),
    _spec("resnet50", "resnet50", slow=True),
    _spec("resnet101", "resnet101", slow=True),
    _spec("mobilenetv3", "mobilenet_v3_small", slow=False),
]
