"""User models from a YAML manifest (and the ``quantverdict.models`` entry-point group).

A manifest entry names a factory as ``"module:callable"`` (imported when first called, never
``eval``-ed; a module that cannot be found is an error at load) or an ONNX file. Paths are
resolved against the manifest's folder. See ``fixtures/models.yaml``.
"""
from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Iterable

import yaml

from quantverdict.errors import HarnessError
from quantverdict.models.spec import InputSpec, ModelSpec, Ref

ENTRY_POINT_GROUP = "quantverdict.models"
_FIELDS = {"name", "build", "onnx", "quantized", "inputs", "outputs", "task", "calibration", "eval", "tolerances", "slow",
           "unsupported_ops", "build_files", "metric", "recipe"}


def load_manifest(path: Path) -> list[ModelSpec]:
    """Parse a manifest file into model specs; errors name the file and the entry."""
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise HarnessError(f"cannot read model manifest {path}: {exc}") from exc
    root = path.parent.resolve()
    if str(root) not in sys.path:  # lets "module:callable" refer to files beside the manifest
        sys.path.insert(0, str(root))
    return [_entry(entry, path, root) for entry in document.get("models", [])]


def _entry(entry: dict[str, Any], path: Path, root: Path) -> ModelSpec:
    where = f"{path}: model {entry.get('name', '?')!r}"
    unknown = set(entry) - _FIELDS
    if unknown:
        raise HarnessError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_FIELDS)}")
    try:
        calibration = entry.get("calibration")
        return ModelSpec(
            name=entry["name"],
            inputs=[_input(item) for item in entry["inputs"]],
            outputs=list(entry["outputs"]),
            build=_ref(entry["build"]) if "build" in entry else None,
            onnx_path=root / entry["onnx"] if "onnx" in entry else None,
            quantized={precision: root / path for precision, path in (entry.get("quantized") or {}).items()},
            task=entry.get("task", "regression"),
            calibration=calibration if calibration in (None, "synthetic") else _ref(calibration),
            eval_data=_ref(entry["eval"]) if "eval" in entry else None,  # type: ignore[arg-type]
            metric=_ref(entry["metric"]) if "metric" in entry else None,
            recipe=entry.get("recipe") or {},
            tolerances=entry.get("tolerances", {}),
            unsupported_ops=entry.get("unsupported_ops", {}),
            slow=bool(entry.get("slow", False)),
            build_files=None if entry.get("build_files") is None else [root / f for f in entry["build_files"]],
        )
    except (KeyError, ValueError, ImportError, AttributeError, TypeError) as exc:
        raise HarnessError(f"{where}: {type(exc).__name__}: {exc}") from exc


def _ref(target: str) -> Ref:
    """A lazy reference to ``module:callable``, whose module must be importable."""
    module, _, attribute = target.partition(":")
    if not attribute:
        raise ValueError(f"expected 'module:callable', got {target!r}")
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"No module named {module!r}")
    return Ref(target)


def _input(item: dict[str, Any]) -> InputSpec:
    return InputSpec(
        name=item["name"],
        shape=tuple(item["shape"]),
        dtype=item.get("dtype", "float32"),
        value_range=tuple(item.get("range", (-1.0, 1.0))),  # type: ignore[arg-type]
        dynamic_axes={int(k): v for k, v in item.get("dynamic_axes", {0: "batch"}).items()},
        resolution=None if item.get("resolution") is None else float(item["resolution"]),
    )


def entry_point_specs() -> Iterable[ModelSpec]:
    """Specs contributed by installed packages: each entry point returns a spec or a list."""
    for point in entry_points(group=ENTRY_POINT_GROUP):
        loaded = point.load()()
        yield from loaded if isinstance(loaded, list) else [loaded]
