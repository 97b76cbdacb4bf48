"""User models from a YAML manifest (and the ``quantverdict.models`` entry-point group).

A manifest entry names a factory as ``"module:callable"`` (imported when first called, never
``eval``-ed; a module that cannot be found is an error at load) or an ONNX file. Paths are
resolved against the manifest's folder. The schema below is the manifest's whole grammar: a
misspelled field at any depth is one line naming the file, the model, the field's path and the
closest allowed name. ``quantverdict init`` writes a starter manifest that documents every field.

A manifest is code, like a conftest.py: it names Python callables that are imported and run, and
files that are read wherever they are. Run only manifests you would run as code.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from quantverdict.documents import DocumentError, dotted, read_yaml, validate
from quantverdict.errors import HarnessError
from quantverdict.judge.tolerances import OutputKind, PrecisionName, Tolerance
from quantverdict.models import registered_specs
from quantverdict.models.spec import DetectionFormat, InputSpec, ModelSpec, Ref, SequenceFormat
from quantverdict.run.output_entries import DetectionEntry, Entry, SequenceEntry
from quantverdict.registry import Registry

CALLABLE = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
CallableRef = Annotated[str, Field(pattern=CALLABLE)]
ALL = "all"


class InputEntry(Entry):
    name: str
    shape: list[Annotated[int, Field(gt=0)]]  # []: a scalar, fed as a 0-d tensor
    dtype: Literal["float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"] = "float32"
    range: tuple[float, float] = (-1.0, 1.0)
    dynamic_axes: dict[Annotated[int, Field(ge=0)], str] | None = None  # {0: batch} where the input has axes
    resolution: Annotated[float, Field(gt=0)] | None = None
    value: float | None = None  # a fixed value (a sample rate): every batch's, filled in where a batch omits it

    @model_validator(mode="after")
    def _axes(self) -> "InputEntry":
        beyond = sorted(axis for axis in self.dynamic_axes or {} if axis >= len(self.shape))
        if beyond:
            raise ValueError(f"dynamic_axes names axis {beyond[0]} of a {len(self.shape)}-d input (shape {self.shape})")
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"value: expected a finite number, got {self.value}")
        return self

    @field_validator("range")
    @classmethod
    def _range(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"expected [low, high] with finite low < high, got [{low}, {high}]")
        return value


class ModelEntry(Entry):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    build: CallableRef | None = None
    onnx: str | None = None
    quantized: dict[PrecisionName, str] = {}  # type: ignore[valid-type]
    inputs: list[InputEntry] = Field(min_length=1)
    outputs: list[str] = Field(min_length=1)
    output_kinds: dict[str, OutputKind] = {}  # judge.output_kinds
    thresholds: dict[str, Annotated[float, Field(gt=0, lt=1)]] = {}  # a probability map's cut (judge.map_decisions)
    detections: dict[str, DetectionEntry] = {}  # detector heads and their layout (judge.detections)
    sequences: dict[str, SequenceEntry] = {}  # CTC outputs, judged by what they decode to (judge.sequences)
    task: Literal["classification", "regression", "embedding"] = "regression"
    calibration: str | None = None
    eval: CallableRef | None = None
    metric: CallableRef | None = None
    tolerances: dict[PrecisionName, Tolerance] = {}  # type: ignore[valid-type]
    recipe: dict[PrecisionName, dict[str, Any] | Literal["auto"]] = {}  # type: ignore[valid-type]
    unsupported_ops: dict[str, list[str]] = {}
    slow: bool = False
    build_files: list[str] | None = None

    @field_validator("calibration")
    @classmethod
    def _calibration(cls, value: str | None) -> str | None:
        import re

        if value is not None and value != "synthetic" and not re.match(CALLABLE, value):
            raise ValueError(f"expected 'synthetic' or 'module:callable', got {value!r}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> "ModelEntry":
        if (self.build is None) == (self.onnx is None):
            raise ValueError("give exactly one of build: (a module:callable factory) and onnx: (a file)")
        return self


class ManifestDocument(Entry):
    models: list[ModelEntry] = []
    # registered models (built-in, zoo, installed packages') to run beside this manifest's own; "all": every one
    include: list[str] = []

    @field_validator("include", mode="before")
    @classmethod
    def _all(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("models", mode="before")
    @classmethod
    def _none_yet(cls, value: Any) -> Any:
        """``models:`` with its entries still commented out (the starter manifest's) declares none."""
        return [] if value is None else value


@dataclass(frozen=True)
class Manifest:
    """A manifest read and checked: its own model specs, and the registered models it includes."""

    path: Path
    specs: list[ModelSpec]
    include: list[str]


def load_manifest(path: Path) -> Manifest:
    """Parse and validate a manifest; every problem is one line naming the file, model and field."""
    document = read_yaml(path, "model manifest")
    entries = validate({} if document is None else document, ManifestDocument, str(path), _describe)
    root = path.parent.resolve()
    if str(root) not in sys.path:  # lets "module:callable" refer to files beside the manifest
        sys.path.insert(0, str(root))
    problems = [line for index, entry in enumerate(entries.models) for line in _check(entry, index, path)]
    names = [entry.name for entry in entries.models]
    problems += [f"{path}: model {name!r}: declared twice" for name in sorted({n for n in names if names.count(n) > 1})]
    if problems:
        raise DocumentError("\n".join(problems))
    return Manifest(path, [_spec(entry, root) for entry in entries.models], entries.include)


def _describe(document: Any, loc: tuple[Any, ...]) -> str:
    """``model 'x'`` for a path inside ``models[i]`` whose entry has a name."""
    if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int) and isinstance(document, dict):
        entries = document.get("models")
        if isinstance(entries, list) and loc[1] < len(entries) and isinstance(entries[loc[1]], dict):
            name = entries[loc[1]].get("name")
            return f"model {name!r}" if isinstance(name, str) else ""
    return ""


def _check(entry: ModelEntry, index: int, path: Path) -> list[str]:
    """What the schema cannot see: factories' modules that cannot be found, recipe settings the
    recipe refuses (the recipe is the one source of its settings), backends that do not exist."""
    from quantverdict.tune.auto import auto_settings
    from quantverdict.precision import get_recipe

    where = f"{path}: model {entry.name!r}: models[{index}]"
    problems = []
    for field in ("build", "calibration", "eval", "metric"):
        target = getattr(entry, field)
        if target and target != "synthetic":
            module = target.partition(":")[0]
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError) as exc:  # a parent package that fails to import
                found, module = False, f"{module} ({type(exc).__name__}: {exc})"
            if not found:
                problems.append(f"{where}.{field}: cannot find module {module!r} (searched beside the manifest "
                                "and on sys.path)")
    root = path.parent
    problems += [f"{where}.build_files[{number}]: {name} does not exist (beside the manifest: {root / name})"
                 for number, name in enumerate(entry.build_files or []) if not (root / name).exists()]
    for precision, settings in _recipes(entry).items():
        try:
            given = entry.recipe.get(precision)
            if isinstance(given, dict) and "auto" in given:
                auto_settings(given)  # auto: 'false', or the search's settings beside auto: false
            if auto_settings(settings) is None:
                get_recipe(precision).configured(settings)
            elif precision not in AUTO_BY_DEFAULT:
                problems.append(f"{where}.recipe.{precision}: auto: a search chooses only "
                                f"{' and '.join(p.upper() for p in AUTO_BY_DEFAULT)} recipes; {precision.upper()} has "
                                "no settings to search")
        except HarnessError as exc:
            problems.append(f"{where}.recipe.{precision}: {exc}")
    from quantverdict.backends import backend_registry
    from quantverdict.documents import suggest

    known = backend_registry().names()
    problems += [f"{where}.{dotted(('unsupported_ops', name))}: unknown backend{suggest(name, known)}"
                 for name in entry.unsupported_ops if name not in known]
    return problems


def _spec(entry: ModelEntry, root: Path) -> ModelSpec:
    calibration = entry.calibration
    heads = {**{name: DetectionEntry() for name, kind in entry.output_kinds.items() if kind == "detections"},
             **entry.detections}
    image = next(((item.shape[-2], item.shape[-1]) for item in entry.inputs if len(item.shape) >= 3), None)
    return ModelSpec(
        name=entry.name,
        inputs=[_input(item) for item in entry.inputs],
        outputs=list(entry.outputs),
        output_kinds={**entry.output_kinds, **{name: "detections" for name in entry.detections},
                      **{name: "distribution" for name in entry.sequences}},
        thresholds=dict(entry.thresholds),
        detections={name: DetectionFormat(**{**layout.model_dump(), "grid": tuple(layout.grid)}, image=image)
                    for name, layout in heads.items()},
        sequences={name: SequenceFormat(**layout.model_dump()) for name, layout in entry.sequences.items()},
        build=Ref(entry.build) if entry.build else None,
        onnx_path=root / entry.onnx if entry.onnx else None,
        quantized={precision: root / file for precision, file in entry.quantized.items()},
        task=entry.task,
        calibration=calibration if calibration in (None, "synthetic") else Ref(calibration),
        eval_data=Ref(entry.eval) if entry.eval else None,
        metric=Ref(entry.metric) if entry.metric else None,
        recipe=_recipes(entry),
        tolerances={precision: bounds.given() for precision, bounds in entry.tolerances.items()},
        unsupported_ops=entry.unsupported_ops,
        slow=entry.slow,
        build_files=None if entry.build_files is None else [root / f for f in entry.build_files],
    )


AUTO_BY_DEFAULT = ("int8", "fp8")  # the precisions whose recipe is searched unless the manifest names one


def _recipes(entry: ModelEntry) -> dict[str, dict[str, Any]]:
    """The model's recipe settings per precision: ``auto`` spelled out, and searched for INT8 and FP8 where the
    manifest names no recipe (:mod:`quantverdict.tune.search`); a graph the user quantized is not."""
    recipes = {p: {"auto": True} if settings == "auto" else {key: value for key, value in settings.items()
                                                               if not (key == "auto" and value is False)}
               for p, settings in entry.recipe.items()}  # auto: false is the absence of a search
    for precision in AUTO_BY_DEFAULT:
        if precision not in recipes and precision not in entry.quantized:
            recipes[precision] = {"auto": True}
    return recipes


def _input(item: InputEntry) -> InputSpec:
    axes = item.dynamic_axes if item.dynamic_axes is not None else {0: "batch"} if item.shape else {}
    return InputSpec(name=item.name, shape=tuple(item.shape), dtype=item.dtype, value_range=item.range,
                     dynamic_axes=dict(axes), resolution=item.resolution, value=item.value)


def model_registry(manifest: Manifest | None = None) -> Registry[ModelSpec]:
    """Built-ins, zoo and entry-point models, then the manifest's; a duplicate name is an error."""
    registry: Registry[ModelSpec] = Registry("model")
    origin: dict[str, str] = {}
    registered = "registered (a built-in, a zoo network or an installed package's quantverdict.models entry point)"
    for spec, where in [*((spec, registered) for spec in registered_specs()),
                        *((spec, f"declared in {manifest.path}") for spec in (manifest.specs if manifest else []))]:
        if spec.name in origin:
            raise HarnessError(f"model {spec.name!r} is {origin[spec.name]} and {where}: rename one (names are "
                               "case ids)")
        origin[spec.name] = where
        registry.add(spec.name, spec)
    return registry


def default_models(manifest: Manifest | None, registry: Registry[ModelSpec]) -> list[str]:
    """What a run covers when no model is named: the manifest's models and those it includes (``all``:
    every registered one); without a manifest, every registered model."""
    if manifest is None:
        return registry.names()
    own = [spec.name for spec in manifest.specs]
    if ALL in manifest.include:
        return [*own, *(name for name in registry.names() if name not in own)]
    problems = []
    for name in manifest.include:
        if name not in registry.names():
            from quantverdict.documents import closest

            problems.append(f"{manifest.path}: include: unknown model {name!r}{closest(name, registry.names())}")
    if problems:
        raise DocumentError("\n".join(problems))
    return [*own, *(name for name in manifest.include if name not in own)]


def declaration_lines(text: str) -> dict[str, int]:
    """0-based line of each model's ``name:`` in a manifest's text, and of ``include:`` under the key '' (where a
    case's report points)."""
    import re

    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines()):
        named = re.match(r"^\s*-?\s*name:\s*['\"]?([^'\"#\s]+)", line)
        if named:
            lines.setdefault(named.group(1), number)
        elif re.match(r"^include:", line):
            lines.setdefault("", number)
    return lines
