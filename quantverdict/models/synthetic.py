"""Small synthetic networks, one per structure that quantizers and converters treat differently
(their modules live in :mod:`quantverdict.models.nets`, imported only when one is built), with
weights that are the same on every CPU (:mod:`quantverdict.models.seeded`)."""
from __future__ import annotations

from typing import Any

from quantverdict.models.spec import InputSpec, ModelSpec, Ref


def build(name: str) -> Any:
    """The module ``nets.<name>`` with CPU-independent seeded weights."""
    import quantverdict.models.nets as nets
    from quantverdict.models.seeded import seeded_init

    return seeded_init(getattr(nets, name)(), seed=0)


IMAGE = InputSpec("input", (4, 3, 32, 32))



def _spec(name: str, factory: str, inputs: InputSpec, output: str, task: str = "classification") -> ModelSpec:
    return ModelSpec(name, [inputs], [output], build=Ref("quantverdict.models.synthetic:build", (factory,)),
                     task=task, calibration="synthetic")  # type: ignore[arg-type]


SPECS = [
    _spec("mlp", "mlp", InputSpec("input", (8, 64)), "logits"),
    _spec("cnn", "cnn", IMAGE, "logits"),
    _spec("resblock", "ResidualBlock", IMAGE, "logits"),
    _spec("dwblock", "dwblock", IMAGE, "logits"),
    _spec("transformer-block", "TransformerBlock", InputSpec("tokens", (4, 16, 64)), "hidden", task="regression"),
]
