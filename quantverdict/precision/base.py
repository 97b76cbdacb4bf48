"""The recipe interface: turn an FP32 ONNX graph into the graph for one precision."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from quantverdict.precision.rescaling import Prepared, Rescaling

if TYPE_CHECKING:
    from quantverdict.precision.settings import RecipeSettings

ChannelRanges = Callable[[bytes, Sequence[str], int], Mapping[str, np.ndarray]]
"""(graph bytes, tensor names, channel axis) → per-channel amax of each over the calibration set."""


class Recipe:
    """A precision recipe; subclasses override :meth:`apply_impl` and, if calibrated,
    :meth:`tensors_to_calibrate`.

    ``runtime`` holds settings a backend applies at build/run time instead of in the graph
    (TF32 is a math mode, not a graph change).
    """

    name: str = ""
    calibrated: bool = False
    quantized: bool = False  # values rounded to a quantization grid: judged as recipe and runtime apart
    calibrator: Any = None  # a Calibrator for calibrated recipes
    calibration_data: bool = False  # calibrates itself from the calibration batches (apply_batches), not ranges
    configurable: bool = False  # takes recipe settings (a manifest's recipe:, --recipe-option)
    fallback_pending: bool = False  # layers to keep in FP32 still to be chosen on the calibration set (fallback)
    min_opset: int = 0  # the lowest default-domain opset whose operators and types the recipe's graph needs
    storage_limit: float | None = None  # the largest finite value of the format tensors are stored in unscaled
    storage_type: int | None = None  # that format's ONNX type (onnx.TensorProto.FLOAT16…)
    quantized_type: int | None = None  # the ONNX type its quantized weights are stored in (None: any it writes)
    runtime: Mapping[str, Any] = {}

    def params(self) -> dict[str, Any]:
        """Everything besides the input graph and ranges that changes the output graph."""
        return {"recipe": type(self).__name__, "name": self.name}

    def tensors_to_calibrate(self, model: onnx.ModelProto) -> list[str]:
        return []

    def float_reasons(self, source: onnx.ModelProto) -> dict[str, str]:
        """Why each weighted layer of the FP32 graph ``source`` that this recipe leaves in float is left so, by node
        name, each reason led by its kind (``excluded``, ``fallback``, ``no kernel``, ``placement``, ``supplied``:
        :mod:`quantverdict.precision.coverage`), "no kernel: …". A float layer with no reason is one the recipe missed, and no verdict passes it."""
        return {}

    def planned_layers(self, source: onnx.ModelProto) -> set[str] | None:
        """The layers of the FP32 graph ``source`` this recipe quantizes, known before it calibrates anything (its
        placement); None where only making its graph tells (another quantizer's own placement)."""
        return None

    def rewritten_layers(self, source: onnx.ModelProto) -> set[str]:
        """The layers of ``source`` this recipe quantizes by rounding their weights in place, which no
        DequantizeLinear marks in its graph (FP4's simulation); most recipes mark theirs."""
        return set()

    @property
    def ranges_describe_it(self) -> bool:
        """Whether the FP32 graph plus the calibrated ranges say everything this recipe does (so a runtime
        that quantizes by itself from ranges, TensorRT 10's implicit INT8, computes the same function).
        False where the recipe rewrites the graph or chooses weights itself."""
        return False

    def calibration_recipe(self) -> "Recipe":
        """The recipe whose tensors are calibrated for this one: a superset, so variants that
        quantize fewer layers (sensitivity, fallback) reuse one calibration pass."""
        return self

    def configured(self, settings: "RecipeSettings | Mapping[str, object]") -> "Recipe":
        """This recipe with named settings (a manifest's ``recipe:``, ``--recipe-option``: :class:`RecipeSettings`);
        most recipes take none."""
        from quantverdict.precision.settings import RecipeSettings

        given = settings.given() if isinstance(settings, RecipeSettings) else tuple(settings)
        if given:
            from quantverdict.errors import HarnessError

            raise HarnessError(f"recipe {self.name!r} takes no settings; got {sorted(given)}")
        return self

    def for_target(self, target: str) -> "Recipe":
        """The variant of this recipe for a backend's graph target (``"emulated"`` for CPU
        executors, ``"native"`` for TensorRT's strongly typed builders); most are the same."""
        return self

    def prepare(self, model: onnx.ModelProto, channel_amax: "ChannelRanges") -> Prepared:
        """A rewrite of the FP32 graph that keeps its function and makes it quantize better (SmoothQuant,
        activation equalization), done before calibration; ``channel_amax(graph bytes, tensors, axis)``
        gives per-channel ranges of named tensors of that graph over the calibration set. Most recipes
        change nothing."""
        return Prepared(model)

    def correct(self, quantized: onnx.ModelProto, fp32: onnx.ModelProto, batches: Sequence[Any],
                rescaling: Rescaling | None = None) -> onnx.ModelProto:
        """A correction of the graph this recipe made, measured against the (prepared) FP32 graph on
        the calibration batches (bias correction); ``rescaling``: how ``fp32``'s preparation rescaled it. Most
        recipes change nothing."""
        return quantized

    def apply(self, model: onnx.ModelProto, ranges: Mapping[str, float] | None = None) -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        out = self.apply_impl(out, ranges or {})
        onnx.checker.check_model(out)
        return out

    def apply_impl(self, model: onnx.ModelProto, ranges: Mapping[str, float]) -> onnx.ModelProto:
        return model

    def apply_batches(self, model: onnx.ModelProto, batches: Sequence[Any]) -> onnx.ModelProto:
        """For ``calibration_data`` recipes: the graph, calibrated on ``batches`` by the recipe itself."""
        raise NotImplementedError
