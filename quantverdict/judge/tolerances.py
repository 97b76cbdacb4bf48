"""Tolerances as data: a per-precision default table with per-model overrides."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import yaml

from quantverdict.errors import HarnessError
from quantverdict.judge.intervals import samples_to_resolve

DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "fixtures" / "tolerances.yaml"


@dataclass(frozen=True)
class Tolerance:
    """Bounds for one case; ``None`` means the metric is reported but not checked."""

    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    max_norm_err: float | None = None
    min_top1: float | None = None
    max_accuracy_drop: float | None = None
    max_flip_fraction: float | None = None  # runtime fidelity (quantverdict.judge.fidelity); quantized precisions
    task_min: Mapping[str, float] | None = None  # bounds on the model's task metrics, by name (judge.task_metrics)
    task_max: Mapping[str, float] | None = None

    def to_dict(self) -> dict[str, float]:
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in asdict(self).items() if v is not None}


_NAMES = {f.name for f in fields(Tolerance)}


@dataclass(frozen=True)
class ToleranceTable:
    defaults: Mapping[str, Mapping[str, float]]
    models: Mapping[str, Mapping[str, Mapping[str, float]]]

    @classmethod
    def load(cls, path: Path | None = None) -> "ToleranceTable":
        path = path or DEFAULT_TABLE
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise HarnessError(f"cannot read tolerance file {path}: {exc}") from exc
        table = cls(document.get("defaults", {}), document.get("models", {}) or {})
        for where, bounds in table._sections():
            unknown = set(bounds) - _NAMES
            if unknown:
                raise HarnessError(f"{path}: {where}: unknown tolerance(s) {sorted(unknown)}; "
                                   f"allowed: {sorted(_NAMES)}")
        return table

    def _sections(self) -> list[tuple[str, Mapping[str, Any]]]:
        out = [(f"defaults.{p}", b) for p, b in self.defaults.items()]
        for model, per_precision in self.models.items():
            out += [(f"models.{model}.{p}", b) for p, b in per_precision.items()]
        return out

    def samples_to_resolve(self, model: str, spec_overrides: Mapping[str, Mapping[str, float]],
                           labelled: bool) -> int:
        """The fewest evaluation samples on which every top-1 bound of ``model`` (and, for a labelled
        set, every accuracy-drop bound), in any precision, allows at least one sample's change."""
        precisions = {*self.defaults, *spec_overrides, *self.models.get(model, {})}
        bounds = [self.resolve(model, p, spec_overrides) for p in precisions]
        return max([samples_to_resolve(b.min_top1, b.max_accuracy_drop if labelled else None) for b in bounds],
                   default=1)

    def resolve(self, model: str, precision: str, spec_overrides: Mapping[str, Mapping[str, float]]) -> Tolerance:
        """Defaults, then the model spec's own bounds, then this table's per-model bounds."""
        merged: dict[str, float] = dict(self.defaults.get(precision, {}))
        merged.update(spec_overrides.get(precision, {}))
        merged.update(self.models.get(model, {}).get(precision, {}))
        return Tolerance(**merged)
