"""Small synthetic networks, one per structure that quantizers and converters treat differently
(their modules live in :mod:`quantverdict.models.nets`, imported only when one is built)."""
from __future__ import annotations

from quantverdict.models.spec import InputSpec, ModelSpec, Ref

IMAGE = InputSpec("input", (4, 3, 32, 32))

SPECS = [
    ModelSpec("mlp", [InputSpec("input", (8, 64))], ["logits"], build=Ref("quantverdict.models.nets:mlp"),
              task="classification", calibration="synthetic"),
    ModelSpec("cnn", [IMAGE], ["logits"], build=Ref("quantverdict.models.nets:cnn"), task="classification",
              calibration="synthetic"),
    ModelSpec("resblock", [IMAGE], ["logits"], build=Ref("quantverdict.models.nets:ResidualBlock"),
              task="classification", calibration="synthetic"),
    ModelSpec("dwblock", [IMAGE], ["logits"], build=Ref("quantverdict.models.nets:dwblock"), task="classification",
              calibration="synthetic"),
    ModelSpec("transformer-block", [InputSpec("tokens", (4, 16, 64))], ["hidden"],
              build=Ref("quantverdict.models.nets:TransformerBlock"), calibration="synthetic"),
]
