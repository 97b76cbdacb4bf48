"""The model zoo: built-in specs, the trained networks of the [zoo] extra, and models installed
packages register through the ``quantverdict.models`` entry-point group. User manifests are read by
:mod:`quantverdict.run.manifest`, which checks them against recipes and tolerances too."""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import Iterable

from quantverdict.models import digits, synthetic, text, vision, zoo
from quantverdict.models.spec import Batch, InputSpec, LabeledData, ModelSpec

__all__ = ["Batch", "InputSpec", "LabeledData", "ModelSpec", "BUILTIN", "ENTRY_POINT_GROUP", "registered_specs"]

ENTRY_POINT_GROUP = "quantverdict.models"
BUILTIN: list[ModelSpec] = [*synthetic.SPECS, *vision.SPECS, digits.SPEC]
ZOO: list[ModelSpec] = [*zoo.specs(), *text.specs()]  # trained networks, where the [zoo] extra is installed


def entry_point_specs() -> Iterable[ModelSpec]:
    """Specs contributed by installed packages: each entry point returns a spec or a list."""
    for point in entry_points(group=ENTRY_POINT_GROUP):
        loaded = point.load()()
        yield from loaded if isinstance(loaded, list) else [loaded]


def registered_specs() -> list[ModelSpec]:
    """Every model known without a manifest: built-ins, zoo networks, entry-point models."""
    return [*BUILTIN, *ZOO, *entry_point_specs()]
