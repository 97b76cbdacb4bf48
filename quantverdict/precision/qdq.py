"""Explicit quantization: Q/DQ pairs in the layout TensorRT's strongly typed mode expects.

Activations feeding Conv/Gemm/MatMul get one symmetric per-tensor QuantizeLinear → DequantizeLinear pair (shared by all
consumers); weights are stored quantized with a per-output-channel DequantizeLinear; biases stay float (TensorRT's
parser rejects an int32 DQ). With ``residual_add``, a residual Add gets a pair on its residual input only, as NVIDIA's
Model Optimizer places it (``build_non_residual_input_map``): an Add one of whose inputs comes from a convolution
(through the ops TensorRT fuses into it) takes that input in the convolution's epilogue, and TensorRT fuses the Add
there if its other input is quantized. Adds with no convolution behind them (a transformer's residual stream, an
attention mask added to scores) stay in float. ``exclude`` (fnmatch patterns on node names) keeps layers in high
precision; ``only`` quantizes just the named layers (sensitivity analysis); ``fallback`` (a share of the weighted
layers) keeps that share of them in ``fallback_format`` (FP32, FP16, or, in an INT8 recipe, FP8 Q/DQ:
:mod:`quantverdict.precision.wider_layers`), the most sensitive on the calibration set
(:func:`quantverdict.tune.fallback.choose_fallback`); ``fallback_layers`` records those chosen. Convolutions
TensorRT has no quantized kernel for in the format (:func:`tensorrt_quantizes_conv`) stay in float, as Model Optimizer
leaves them.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import onnx

from quantverdict.errors import CalibrationError
from quantverdict.precision.base import ChannelRanges, Recipe
from quantverdict.precision.bodies import as_model, branches, in_branch, put_back
from quantverdict.precision.calibrators import Calibrator
from quantverdict.precision.graph import initializer_names, topological_sort
from quantverdict.precision.grids import FP8_E4M3, INT8, QuantFormat
from quantverdict.precision.qdq_nodes import activation_qdq, weight_dq
from quantverdict.precision.qdq_settings import other_quantizer
from quantverdict.precision.recurrent import dynamic_lstms, quantizable
from quantverdict.precision.rescaling import Prepared, Rescaling
from quantverdict.precision.settings import UNSET, Formats, RecipeSettings, formats_setting
from quantverdict.precision.wider_layers import kept_formats, layers_in_fp16
from quantverdict.precision.placement import (QDQ_OPS, QUANTIZED_INPUTS, WEIGHTED_OPS, activation_readers,
                                              float_reasons, residual_inputs, tensorrt_quantizes_conv, weight_axis)

@dataclass(frozen=True)
class QDQOptions:
    """Which layers a Q/DQ recipe quantizes, and how it calibrates them."""

    calibrator: Calibrator = Calibrator()
    ops: tuple[str, ...] = QDQ_OPS
    residual_add: bool = True
    exclude: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None
    smoothquant: float | None = None  # SmoothQuant's migration strength α (quantverdict.precision.smoothquant)
    equalize: bool = False  # activation equalization between convolutions (quantverdict.precision.equalize)
    gptq: bool = False  # weights rounded to minimize each layer's output error (quantverdict.precision.gptq)
    bias_correction: bool = False  # output means matched to FP32's (quantverdict.precision.bias_correction)
    fallback: float | None = None  # share of the weighted layers accuracy-aware fallback keeps wider
    fallback_layers: tuple[str, ...] | None = None  # the layers it kept (None: not chosen yet)
    fallback_format: Formats = ("fp32",)  # those it may keep them in (precision.wider_layers); FP32 adds no param
    layer_formats: tuple[tuple[str, str], ...] = ()  # each kept layer's, chosen where fallback_format offers several
    native: bool = False  # TensorRT's graph: those layers natively in their format, not emulated in FP32
    tag: str = ""  # in the names of the Q/DQ tensors it adds: a second format's pass over the fallback layers
    tensorrt_kernels: bool = True  # leave float the convolutions TensorRT has no kernel for (tensorrt_quantizes_conv)
    recurrent: str = "float"  # LSTMs in float, or "dynamic": ONNX Runtime's INT8 kernel (quantverdict.precision.recurrent)

    def kept(self) -> dict[str, str]:
        """Each layer fallback keeps, with its format: its own where one was chosen, else the widest offered."""
        chosen = dict(self.layer_formats)
        return {layer: chosen.get(layer, self.fallback_format[-1]) for layer in self.fallback_layers or ()}


class QDQ(Recipe):
    """Post-training quantization to ``fmt`` with calibrated activation ranges."""

    calibrated = True
    quantized = True
    configurable = True

    def __init__(self, fmt: QuantFormat, options: QDQOptions | None = None):
        self.fmt = fmt
        self.name = fmt.name
        self.options = options or QDQOptions()
        self.quantized_type = fmt.onnx_type  # a fallback layer in FP8 is not one of its INT8 layers
        opts = self.options
        offered = kept_formats(opts.fallback_format, fmt)  # an FP8 recipe offered FP8 fails here
        chosen = len(opts.fallback_format) > 1 and opts.fallback_layers is not None  # float8 Q/DQ only if a layer is
        in_use = kept_formats(tuple(opts.kept().values()), fmt) if chosen else offered
        self.min_opset = max([fmt.min_opset] + [f.min_opset for f in in_use])
        if opts.recurrent != "float" and fmt is not INT8:
            raise CalibrationError(f"recurrent: {opts.recurrent} quantizes LSTMs as ONNX Runtime's DynamicQuantizeLSTM, "
                                   f"an INT8 kernel; {fmt.name} has none: remove it from the {fmt.name} recipe")

    @property
    def calibrator(self) -> Calibrator:
        """The options' calibrator; an FP8 recipe's ``mse`` weighs E4M3's rounding, not int8's."""
        calibrator = self.options.calibrator
        return replace(calibrator, grid="e4m3") if self.fmt is FP8_E4M3 and calibrator.method == "mse" else calibrator

    @property
    def ranges_describe_it(self) -> bool:
        opts = self.options
        return not (opts.smoothquant is not None or opts.equalize or opts.gptq or opts.bias_correction or opts.exclude
                    or opts.only is not None or opts.fallback is not None or opts.fallback_layers)

    def with_options(self, **changes: Any) -> "QDQ":
        return QDQ(self.fmt, replace(self.options, **changes))

    def with_kept(self, kept: Mapping[str, str]) -> "QDQ":
        """The recipe with fallback keeping ``kept`` (layer → format), recorded where several formats are offered."""
        chosen = tuple(sorted(kept.items())) if len(self.options.fallback_format) > 1 else ()
        return self.with_options(fallback_layers=tuple(kept), layer_formats=chosen)

    @property
    def fallback_pending(self) -> bool:
        return self.options.fallback is not None and self.options.fallback_layers is None

    def configured(self, settings: RecipeSettings | Mapping[str, object]) -> Recipe:
        """This recipe with ``settings`` (:class:`RecipeSettings`) over its options, or, where their ``quantizer`` is
        not ``harness``, NVIDIA Model Optimizer's ONNX PTQ (``modelopt``: its own placement and calibration) or ONNX
        Runtime's quantize_static (``onnxruntime``, INT8 only), so that one run can set them side by side on the same
        data."""
        given = RecipeSettings.parse(settings, self.name)
        if given.quantizer not in (UNSET, "harness"):
            return other_quantizer(self.name, self.fmt, given)
        return self.with_settings(given)

    def with_settings(self, settings: RecipeSettings) -> "QDQ":
        return self.with_options(**settings.qdq_options())

    def params(self) -> dict[str, Any]:
        opts = self.options
        return {**super().params(), "format": self.fmt.name, "ops": sorted(opts.ops),
                "residual_add": opts.residual_add, "exclude": sorted(opts.exclude),
                "only": None if opts.only is None else sorted(opts.only), "calibration": opts.calibrator.params,
                "smoothquant": opts.smoothquant, "equalize": opts.equalize, "gptq": opts.gptq,
                "bias_correction": opts.bias_correction, "tensorrt_kernels": opts.tensorrt_kernels,
                "fallback": opts.fallback,
                "fallback_layers": None if opts.fallback_layers is None else sorted(opts.fallback_layers),
                **({"fallback_format": formats_setting(opts.fallback_format)} if opts.fallback_format != ("fp32",)
                   else {}),
                **({"layer_formats": dict(opts.layer_formats)} if opts.layer_formats else {}),
                **({"native": opts.native} if "fp16" in opts.fallback_format else {}),
                **({"recurrent": opts.recurrent} if opts.recurrent != "float" else {}),
                "weights": "per-channel symmetric", "activations": "per-tensor symmetric"}

    def planned_layers(self, source: onnx.ModelProto) -> set[str]:
        """The layers it quantizes, those inside an ``If``'s branches named ``<If>/<layer>`` (:mod:`.bodies`)."""
        inside = {f"{node.name}/{layer.name}" for node, _, body in branches(source)
                  for layer in self.quantized_nodes(as_model(body, source))}
        return {node.name for node in self.quantized_nodes(source)} | inside

    def quantized_nodes(self, model: onnx.ModelProto) -> list[onnx.NodeProto]:
        """The nodes whose inputs this recipe quantizes, after ``ops``/``exclude``/``fallback_layers``/``only``."""
        return [node for node, _ in self.quantized_inputs(model)]

    def weighted_nodes(self, model: onnx.ModelProto) -> list[onnx.NodeProto]:
        """The Conv/Gemm/MatMul layers it quantizes: those a fallback may keep wider."""
        return [node for node in self.quantized_nodes(model) if node.op_type in WEIGHTED_OPS]

    def quantized_inputs(self, model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, tuple[int, ...]]]:
        """Each quantized node with the indices of the inputs that get a Q/DQ pair."""
        residual = residual_inputs(model) if self.options.residual_add else {}
        weights = {init.name: list(init.dims) for init in model.graph.initializer}
        graph_inputs = {value.name for value in model.graph.input}
        chosen = []
        for node in model.graph.node:
            if node.op_type == "Add" and node.output[0] in residual:
                inputs: tuple[int, ...] = (residual[node.output[0]],)
            elif self.options.recurrent == "dynamic" and not self.options.native and quantizable(node, weights):
                inputs = ()  # the kernel quantizes its inputs itself (dynamic_lstms)
            elif node.op_type in self.options.ops:
                inputs = QUANTIZED_INPUTS[node.op_type]
                if node.op_type in ("Conv", "ConvTranspose") and self.options.tensorrt_kernels and not tensorrt_quantizes_conv(
                        node, weights.get(node.input[1]), self.fmt, node.input[0] in graph_inputs):
                    continue
            else:
                continue
            if any(fnmatch.fnmatchcase(node.name, pattern) for pattern in self.options.exclude):
                continue
            if node.name in (self.options.fallback_layers or ()):
                continue
            if self.options.only is not None and node.name not in self.options.only:
                continue
            chosen.append((node, inputs))
        return chosen

    def float_reasons(self, source: onnx.ModelProto) -> dict[str, str]:
        """Each weighted layer this recipe leaves in float, and why (:func:`placement.float_reasons`)."""
        opts = self.options
        return float_reasons(source, {node.name for node in self.quantized_nodes(source)}, self.fmt, opts.exclude,
                             opts.kept(), opts.only, opts.tensorrt_kernels, opts.fallback_format)

    def for_target(self, target: str) -> Recipe:
        """INT8 for ONNX Runtime's CPU kernels (the speed lane) is ONNX Runtime's own layout."""
        if target == "onnxruntime-cpu" and self.fmt is INT8:
            from quantverdict.precision.ort_cpu import OrtCpuInt8

            return OrtCpuInt8()
        return self.with_options(native=target == "native")

    def prepare(self, model: onnx.ModelProto, channel_amax: ChannelRanges) -> Prepared:
        """Equalization and smoothing over every candidate layer, whatever ``only``/``exclude`` say:
        both keep the FP32 function, so variants that quantize fewer layers share one prepared graph."""
        if not self.options.equalize and self.options.smoothquant is None:
            return Prepared(model)
        before = onnx.ModelProto()
        before.CopyFrom(model)
        rescaling = Rescaling(before)
        if self.options.equalize:
            from quantverdict.precision.equalize import equalize

            model = equalize(model, channel_amax, rescaling)
        if self.options.smoothquant is not None:
            from quantverdict.precision.smoothquant import smooth

            model = smooth(model, channel_amax, self.options.smoothquant, rescaling)
        return Prepared(model, rescaling)

    def correct(self, quantized: onnx.ModelProto, fp32: onnx.ModelProto, batches: Sequence[Any],
                rescaling: Rescaling | None = None) -> onnx.ModelProto:
        """GPTQ's weight rounding (H from the graph before preparation where ``rescaling`` says how), then bias
        correction (measured with the weights as they end up)."""
        if self.options.gptq:
            from quantverdict.precision.gptq import round_weights

            quantized = round_weights(quantized, fp32, batches, rescaling)
        if self.options.bias_correction:
            from quantverdict.precision.bias_correction import correct_biases

            quantized = correct_biases(quantized, fp32, batches)
        return quantized

    def calibration_recipe(self) -> "QDQ":
        return self.with_options(only=None, exclude=(), fallback_layers=None)

    def tensors_to_calibrate(self, model: onnx.ModelProto) -> list[str]:
        return list(activation_readers(self.quantized_inputs(model), initializer_names(model)))

    def apply_impl(self, model: onnx.ModelProto, ranges: Mapping[str, float]) -> onnx.ModelProto:
        graph = model.graph
        plan = self.quantized_inputs(model)
        readers = activation_readers(plan, initializer_names(model))
        missing = [t for t in readers if t not in ranges]
        if missing:
            raise CalibrationError(f"no calibrated range for tensor(s) {missing[:5]} of graph {graph.name!r}")
        weights = {init.name: init for init in graph.initializer}
        new_nodes: list[onnx.NodeProto] = []
        for tensor, at in readers.items():
            new_nodes += activation_qdq(graph, self.fmt, tensor, self.options.tag, ranges[tensor], at)
        copies: dict[str, int] = {}  # a tied weight: its own stored copy, scale and DQ per quantized layer
        for node, _ in plan:
            name = node.input[1] if node.op_type in QDQ_OPS else ""
            if name not in weights:
                continue
            base = f"{name}{self.options.tag}" if name not in copies else f"{name}{self.options.tag}_{copies[name]}"
            copies[name] = copies.get(name, 0) + 1
            new_nodes.append(weight_dq(graph, self.fmt, weights[name], weight_axis(node, len(weights[name].dims)), base))
            node.input[1] = f"{base}_dequantized"
        still_read = {name for node in graph.node for name in node.input}  # a tied weight a float layer reads too
        for name in set(copies) - still_read:
            graph.initializer.remove(weights[name])
        graph.node.extend(new_nodes)
        dynamic_lstms(model, [node for node, _ in plan if node.op_type == "LSTM"])
        for node, attribute, body in branches(model):  # each branch as a graph of its own, on its own ranges
            within, placed = in_branch(ranges, node, attribute), as_model(body, model)
            if set(self.tensors_to_calibrate(placed)) <= set(within):  # every range it needs: a nested If's
                # branch has none (its layers stay in float), one of LSTMs alone needs none (DynamicQuantizeLSTM)
                self.with_options(tag=f"{self.options.tag}__{node.name}_{attribute}").apply_impl(placed, within)
                put_back(body, placed, model)
        topological_sort(graph)
        return self._fallback_in_its_format(model, ranges)

    def _fallback_in_its_format(self, model: onnx.ModelProto, ranges: Mapping[str, float]) -> onnx.ModelProto:
        """The fallback layers kept in FP8 quantized again in it on the same ranges (a second pass: those layers
        alone, names tagged), those kept in FP16 in it (:func:`layers_in_fp16`); those kept in FP32 as they are."""
        opts = self.options
        kept = opts.kept()
        in_fp8 = tuple(layer for layer, kept_in in kept.items() if kept_in == FP8_E4M3.name)
        if in_fp8:
            model = QDQ(FP8_E4M3, replace(opts, only=in_fp8, fallback_layers=None, fallback_format=("fp32",),
                                          layer_formats=(), tag="_fp8")).apply_impl(model, ranges)
        in_fp16 = [layer for layer, kept_in in kept.items() if kept_in == "fp16"]
        return layers_in_fp16(model, in_fp16, opts.native) if in_fp16 else model

INT8_RECIPE, FP8_RECIPE = QDQ(INT8), QDQ(FP8_E4M3)
