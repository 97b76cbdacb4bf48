"""torchvision classifiers with seeded random weights (no weights can be downloaded).

Random weights leave BatchNorm at mean 0 / variance 1, so activations grow block by block
unlike a trained network's. Re-estimating the BatchNorm statistics on a few synthetic batches
gives activation ranges shaped like a trained model's, which is what quantization accuracy
depends on. Both the weights and the statistics are the same on every CPU (:mod:`.seeded`).
"""
from __future__ import annotations

from typing import Any

from quantverdict.models.seeded import estimate_batchnorm, seeded_init
from quantverdict.models.spec import InputSpec, ModelSpec, Ref

IMAGENET = InputSpec("input", (4, 3, 224, 224), value_range=(-2.0, 2.0))


def build_torchvision(arch: str) -> Any:
    """torchvision's ``arch`` with seeded random weights and BatchNorm statistics re-estimated on four
    batches of eight synthetic images in [-2, 2]."""
    import torchvision

    model = seeded_init(getattr(torchvision.models, arch)(weights=None), seed=0)
    return estimate_batchnorm(model, batches=4, shape=(8, 3, 224, 224), low=-2.0, high=2.0, seed=1234)


def _spec(name: str, arch: str, slow: bool) -> ModelSpec:
    return ModelSpec(name, [IMAGENET], ["logits"], build=Ref("quantverdict.models.vision:build_torchvision", (arch,)),
                     task="classification", calibration="synthetic", slow=slow)


SPECS = [
    _spec("resnet18", "resnet18", slow=False),
    _spec("resnet50", "resnet50", slow=True),
    _spec("resnet101", "resnet101", slow=True),
    _spec("mobilenetv3", "mobilenet_v3_small", slow=False),
]
