"""The model zoo: built-in specs, manifest models and entry-point models under one registry."""
from __future__ import annotations

from pathlib import Path

from quantverdict.models import digits, synthetic, text, vision, zoo
from quantverdict.models.manifest import entry_point_specs, load_manifest
from quantverdict.models.spec import Batch, InputSpec, LabeledData, ModelSpec
from quantverdict.registry import Registry

__all__ = ["Batch", "InputSpec", "LabeledData", "ModelSpec", "BUILTIN", "model_registry"]

BUILTIN: list[ModelSpec] = [*synthetic.SPECS, *vision.SPECS, digits.SPEC]
ZOO: list[ModelSpec] = [*zoo.specs(), *text.specs()]  # trained networks, where the [zoo] extra is installed


def model_registry(manifest: Path | None = None) -> Registry[ModelSpec]:
    """Built-ins, then entry-point models, then the manifest's; a duplicate name is an error."""
    registry: Registry[ModelSpec] = Registry("model")
    extra = load_manifest(manifest) if manifest is not None and manifest.exists() else []
    for spec in [*BUILTIN, *ZOO, *entry_point_specs(), *extra]:
        registry.add(spec.name, spec)
    return registry
