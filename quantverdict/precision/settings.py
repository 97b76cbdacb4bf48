"""A recipe's settings as one frozen, checked value, whoever gives them: a manifest's ``recipe:``, ``--recipe-option``
and ``--calibration``, a lock entry, a search's candidates. Parsed here and nowhere else (:meth:`RecipeSettings.parse`),
and written back one way (:meth:`RecipeSettings.to_dict`) into the lock, the run record, the page and cache keys; the
recipes read its fields (:meth:`quantverdict.precision.qdq.QDQ.configured`).

A setting not given is :data:`UNSET` (the recipe's own default, and not written), which is not ``None``:
``smoothquant: null`` and ``fallback: null`` are given, and turn the technique off over a model's own setting.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, fields, replace
from typing import Mapping, Union

from quantverdict.documents import suggest
from quantverdict.errors import CalibrationError
from quantverdict.precision.calibrators import Calibrator


class Unset:
    """A setting not given; false, like an empty setting."""

    _only: "Unset | None" = None

    def __new__(cls) -> "Unset":
        if cls._only is None:
            cls._only = super().__new__(cls)
        return cls._only

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset()
RECURRENT_SETTINGS = ("float", "dynamic")  # LSTMs in float, or ONNX Runtime's INT8 (precision.recurrent)
WIDER_FORMATS = ("fp8", "fp16", "fp32")  # a fallback layer's format, narrowest first (FP8: only out of INT8)
Formats = tuple[str, ...]  # the formats a recipe's fallback may keep a layer in, narrowest first
Value = Union[bool, int, float, str, list[str], None]  # a setting as a document writes it


def wider_formats(value: object, setting: str = "fallback_format") -> Formats:
    """A recipe's ``fallback_format`` setting, checked: one format (every fallback layer in it), or several, narrowest
    first, each layer then kept in the narrowest that costs the output, alone, no more than the worst layer left in
    the recipe's own format (:func:`quantverdict.tune.fallback.fallback_per_part`)."""
    given = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    unknown = [item for item in given if item not in WIDER_FORMATS]
    if unknown or not given:
        raise CalibrationError(f"{setting} {value!r}: expected one of {', '.join(WIDER_FORMATS)}, or several "
                               "of them, narrowest first (e.g. [fp16, fp32])")
    order = [WIDER_FORMATS.index(str(item)) for item in given]
    if order != sorted(set(order)):
        raise CalibrationError(f"{setting} {list(given)}: list each format once, narrowest first "
                               f"({', '.join(WIDER_FORMATS)}): each layer is kept in the first that holds")
    return tuple(str(item) for item in given)


def formats_setting(formats: Formats) -> str | list[str]:
    """``formats`` as a setting and a graph's params write them: one format as its name, several as a list."""
    return formats[0] if len(formats) == 1 else list(formats)


def formats_words(value: object) -> str:
    """A ``fallback_format`` setting's value (or a recipe's formats) as one word: ``fp16``, or ``fp16/fp32`` (chosen
    per layer)."""
    return "/".join(wider_formats(value))


@dataclass(frozen=True)
class RecipeSettings:
    """A calibrated recipe's settings; each field :data:`UNSET` unless given."""

    quantizer: str | Unset = UNSET  # who quantizes: the harness, or Model Optimizer's / ONNX Runtime's PTQ
    calibration: str | Unset = UNSET  # the calibrator's method (quantverdict.precision.calibrators)
    smoothquant: float | None | Unset = UNSET  # SmoothQuant's migration strength α; None: off
    equalize: bool | Unset = UNSET  # activation equalization between convolutions
    exclude: tuple[str, ...] | Unset = UNSET  # node-name patterns kept in float
    fallback: float | None | Unset = UNSET  # the share of the weighted layers accuracy-aware fallback keeps wider
    fallback_format: Formats | Unset = UNSET  # the formats it may keep them in, narrowest first
    gptq: bool | Unset = UNSET  # weights rounded to minimise each layer's output error
    bias_correction: bool | Unset = UNSET  # output means matched to FP32's
    recurrent: str | Unset = UNSET  # LSTMs: "float", or "dynamic" (ONNX Runtime's DynamicQuantizeLSTM, INT8 only)

    @classmethod
    def parse(cls, values: "Mapping[str, object] | RecipeSettings", recipe: str) -> "RecipeSettings":
        """``values`` by name, each checked: an unknown name is one line naming the closest known one, a value that
        does not read as its setting one line naming ``recipe``'s settings as given."""
        if isinstance(values, RecipeSettings):
            return values
        names = [field.name for field in fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise CalibrationError(f"unknown {recipe} recipe setting{suggest(unknown[0], sorted(names))}")
        try:
            return cls(**{name: _READ[name](value) for name, value in values.items()})
        except (TypeError, ValueError) as exc:  # smoothquant: banana
            raise CalibrationError(f"{recipe} recipe settings {dict(values)}: {exc}") from None

    @classmethod
    def known(cls, values: Mapping[str, object], recipe: str) -> "RecipeSettings":
        """The settings among ``values`` that are recipe settings (a manifest's ``recipe:`` also holds a search's)."""
        names = {field.name for field in fields(cls)}
        return cls.parse({name: value for name, value in values.items() if name in names}, recipe)

    @classmethod
    def recorded(cls, params: Mapping[str, object], recipe: str) -> "RecipeSettings":
        """The settings a recipe's parameters as a record holds them (``metrics.recipe.settings``) were made with, as
        a run takes them: the layers its fallback kept are not among them (ranked again where they are applied)."""
        values = {name: params[name] for name in _READ if name != "quantizer" and params.get(name) not in (None, [])}
        calibration = values.get("calibration")
        if isinstance(calibration, Mapping):  # a calibrator's parameters
            values["calibration"] = calibration.get("method")
        return cls.parse(values, recipe)

    def given(self) -> tuple[str, ...]:
        """The names of the settings given, in declaration order."""
        return tuple(field.name for field in fields(self) if getattr(self, field.name) is not UNSET)

    def __bool__(self) -> bool:
        return bool(self.given())

    def over(self, base: "RecipeSettings") -> "RecipeSettings":
        """These settings where given, ``base``'s elsewhere."""
        return replace(base, **{name: getattr(self, name) for name in self.given()})

    def unset(self, *names: str) -> "RecipeSettings":
        """These settings with ``names`` not given."""
        return replace(self, **{name: UNSET for name in names})

    def qdq_options(self) -> dict[str, object]:
        """The :class:`quantverdict.precision.qdq.QDQOptions` fields these settings give (the quantizer aside: it picks
        the recipe), each of the same name but the calibration, a :class:`Calibrator`."""
        rest = self.unset("quantizer", "calibration")
        calibrator = {} if isinstance(self.calibration, Unset) else {"calibrator": Calibrator(self.calibration)}
        return {**calibrator, **{name: getattr(rest, name) for name in rest.given()}}

    def fallback_formats(self) -> Formats:
        """The formats fallback may keep its layers in: those given, else FP32."""
        return ("fp32",) if isinstance(self.fallback_format, Unset) else self.fallback_format

    def to_dict(self) -> dict[str, Value]:
        """The settings given, as a document writes them (``exclude`` and several formats as lists)."""
        return {name: _WRITE.get(name, _same)(getattr(self, name)) for name in self.given()}

    def words(self) -> str:
        """``calibration=percentile smoothquant=0.5 fallback_format=fp16/fp32`` for a progress line."""
        return " ".join(f"{name}={'/'.join(map(str, value)) if isinstance(value, list) else value}"
                        for name, value in self.to_dict().items()) or "defaults"


def _method(value: object) -> str:
    return Calibrator(value).method  # type: ignore[arg-type]  # an unknown method is refused there, naming the known


def number(value: object, name: str) -> float:
    """``value`` as a finite number, or a :class:`CalibrationError` naming the setting (``banana``, ``.nan``, a
    string of digits a document quoted are no numbers a setting can take)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CalibrationError(f"{name} {value!r}: expected a finite number")
    return float(value)


def flag(value: object, name: str) -> bool:
    """``value`` as true or false: the string 'false' was taken as true."""
    if not isinstance(value, bool):
        raise CalibrationError(f"{name} {value!r}: expected true or false")
    return value


def _optional_float(value: object) -> float | None:
    return None if value is None else number(value, "smoothquant")


def _share(value: object) -> float | None:
    if value is None:
        return None
    part = number(value, "fallback")
    if not 0 < part < 1:
        raise CalibrationError(f"fallback {value!r}: expected a share of the layers between 0 and 1 (e.g. 0.1)")
    return part


def _patterns(value: object) -> tuple[str, ...]:
    """Node-name patterns from a list, or from one string separated by ``;`` (a command line's value)."""
    items = value.split(";") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
        raise CalibrationError(f"exclude {value!r}: expected a node-name pattern or a list of them")
    return tuple(item.strip() for item in items if item.strip())


def _recurrent(value: object) -> str:
    if value not in RECURRENT_SETTINGS:
        raise CalibrationError(f"recurrent {value!r}: expected one of {', '.join(RECURRENT_SETTINGS)} (dynamic: LSTMs in "
                               "INT8 as ONNX Runtime's DynamicQuantizeLSTM runs them; TensorRT keeps them in float)")
    return str(value)


def _same(value: object) -> Value:
    return value  # type: ignore[return-value]


_READ = {"quantizer": str, "calibration": _method, "smoothquant": _optional_float,
         "equalize": lambda value: flag(value, "equalize"), "exclude": _patterns, "fallback": _share,
         "fallback_format": wider_formats, "gptq": lambda value: flag(value, "gptq"),
         "bias_correction": lambda value: flag(value, "bias_correction"), "recurrent": _recurrent}
_WRITE = {"exclude": list, "fallback_format": formats_setting}
