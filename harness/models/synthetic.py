"""Small synthetic networks, one per structure that quantizers and converters treat differently
(their modules live in :mod:`harness.models.nets`, imported only when one is built)."""
from __future__ import annotations

from harness.models.spec import InputSpec, ModelSpec, Ref

IMAGE = InputSpec("input", (4, 3, 32, 32))

SPECS = [
    ModelSpec("mlp", [InputSpec("input", (8, 64))], ["logits"], build=Ref("harness.models.nets:mlp"),
              task="classification", calibration="synthetic"),
    ModelSpec("cnn", [IMAGE], ["logits"], build=Ref("harness.models.nets:cnn"), task="classification",
              calibration="synthetic"),
    ModelSpec("resblock", [IMAGE], ["logits"], build=Ref("harness.models.nets:ResidualBlock"),
              task="classification", calibration="synthetic"),
    ModelSpec("dwblock", [IMAGE], ["logits"], build=Ref("harness.models.nets:dwblock"), task="classification",
              calibration="synthetic"),
    ModelSpec("transformer-block", [InputSpec("tokens", (4, 16, 64))], ["hidden"],
              build=Ref("harness.models.nets:TransformerBlock"), calibration="synthetic"),
]
