"""Planted defects: the harness's detection power is measured by planting them and counting how
many its checks catch (``python -m quantverdict mutate``).

Each kind is an operator registered here; which kinds run, with what parameters and on which
precisions, is data (``fixtures/mutations.yaml``). An operator acts at one stage:
- ``precision``: edits the quantized graph (a buggy quantizer or a hand-edited model);
- ``calibration``: changes the calibration batches (a data pipeline bug);
- ``fp32``: edits the FP32 graph before any recipe (a model change).
``site`` picks which of the candidate places to plant it: ``first``, ``middle`` or ``last``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import onnx
from onnx import numpy_helper
from pydantic import BaseModel, ConfigDict, field_validator

from quantverdict.documents import load, suggest
from quantverdict.errors import HarnessError
from quantverdict.precision import known_precisions
from quantverdict.models.spec import Batch
from quantverdict.precision.graph import int_attribute
from quantverdict.precision.grids import FP8_E4M3, INT8, QuantFormat, weight_scales
from quantverdict.precision.placement import WEIGHTED_OPS
from quantverdict.registry import Registry

HOMOGENEOUS = ("Relu", "MaxPool", "Flatten", "Reshape")  # f(a·x) = a·f(x) for a > 0
NO_SITE = "no candidate site"


class NotApplicable(HarnessError):
    """The model has no place where this defect can be planted."""


@dataclass(frozen=True)
class Operator:
    stage: str
    edit: Callable[..., Any]  # (graph or batches, site, **params) → same


_OPERATORS: Registry[Operator] = Registry("defect kind")


def operator(kind: str, stage: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        _OPERATORS.add(kind, Operator(stage, function))
        return function
    return register


@dataclass(frozen=True)
class Mutation:
    kind: str
    site: str = "middle"
    params: dict[str, Any] = field(default_factory=dict)
    precisions: tuple[str, ...] = ("int8",)

    @property
    def stage(self) -> str:
        return _OPERATORS.get(self.kind).stage

    @property
    def name(self) -> str:
        values = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.kind}[{self.site}{',' + values if values else ''}]"

    def key(self) -> dict[str, Any]:
        return {"kind": self.kind, "site": self.site, "params": self.params}

    def graph(self, model: onnx.ModelProto) -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        _OPERATORS.get(self.kind).edit(out, self.site, **self.params)
        return out

    def batches(self, batches: list[Batch]) -> list[Batch]:
        return _OPERATORS.get(self.kind).edit(batches, self.site, **self.params)


Site = Literal["first", "middle", "last"]


class Defect(BaseModel):
    """One catalogue entry: a defect kind, its parameters, the precisions and sites it is planted at."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    params: dict[str, float | int | str | bool] = {}
    precisions: list[Literal[tuple(known_precisions())]] = ["int8"]  # type: ignore[valid-type]
    sites: list[Site] | None = None

    @field_validator("kind")
    @classmethod
    def _known(cls, kind: str) -> str:
        if kind not in _OPERATORS.names():
            raise ValueError(f"unknown defect kind{suggest(kind, _OPERATORS.names())}")
        return kind


class Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sites: list[Site] = ["middle"]
    defects: list[Defect] = []


def load_catalogue(path: Path | None = None) -> list[Mutation]:
    """Every (defect, site) of the catalogue (the packaged one, or ``path`` in its place)."""
    document = load(path, "mutations.yaml", Catalogue, "defect catalogue")
    return [Mutation(entry.kind, site, dict(entry.params), tuple(entry.precisions))
            for entry in document.defects for site in (entry.sites or document.sites)]


def _pick(candidates: list[Any], site: str) -> Any:
    if not candidates:
        raise NotApplicable(NO_SITE)
    return candidates[{"first": 0, "middle": len(candidates) // 2, "last": -1}[site]]


def _inits(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {init.name: init for init in model.graph.initializer}


def _set(model: onnx.ModelProto, name: str, values: np.ndarray) -> None:
    _inits(model)[name].CopyFrom(numpy_helper.from_array(values, name))


def _activation_dqs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    weights = _inits(model)
    return [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] not in weights]


def _weight_dqs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    weights = _inits(model)
    return [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in weights]


def _dequantized_weight(dq: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> np.ndarray:
    """A weight DequantizeLinear's output, computed: stored values × per-tensor or per-axis scale."""
    values = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float32)
    scale = numpy_helper.to_array(inits[dq.input[1]])
    shape = [1] * values.ndim
    if scale.size > 1:
        shape[int_attribute(dq, "axis", 1)] = -1
    return values * scale.reshape(shape)


@operator("qdq_mismatch", "precision")
def qdq_mismatch(model: onnx.ModelProto, site: str, factor: float = 1.25) -> None:
    """One activation's DequantizeLinear no longer uses its QuantizeLinear's scale."""
    node = _pick(_activation_dqs(model), site)
    scale = numpy_helper.to_array(_inits(model)[node.input[1]])
    name = f"{node.input[1]}_mismatched"
    model.graph.initializer.append(numpy_helper.from_array((scale * factor).astype(np.float32), name))
    node.input[1] = name


@operator("clipped_range", "precision")
def clipped_range(model: onnx.ModelProto, site: str, factor: float = 0.25) -> None:
    """One activation's calibrated range is too small: both its Q and DQ clip at factor × amax."""
    node = _pick(_activation_dqs(model), site)
    scale = numpy_helper.to_array(_inits(model)[node.input[1]])
    _set(model, node.input[1], (scale * factor).astype(np.float32))


@operator("weight_channel_scale", "precision")
def weight_channel_scale(model: onnx.ModelProto, site: str, factor: float = 1.5) -> None:
    """One output channel of one layer's weights dequantized with a wrong scale."""
    node = _pick([n for n in _weight_dqs(model) if numpy_helper.to_array(_inits(model)[n.input[1]]).size > 1], site)
    scale = numpy_helper.to_array(_inits(model)[node.input[1]]).copy()
    scale[scale.size // 2] *= factor
    _set(model, node.input[1], scale)


@operator("weight_channel_sign", "precision")
def weight_channel_sign(model: onnx.ModelProto, site: str) -> None:
    """One output channel of one layer's weights with its sign flipped."""
    weight_channel_scale(model, site, factor=-1.0)


@operator("per_tensor_weights", "precision")
def per_tensor_weights(model: onnx.ModelProto, site: str) -> None:
    """Per-channel weight scales collapsed to one per tensor (every weighted layer)."""
    fmt_of: dict[int, QuantFormat] = {INT8.onnx_type: INT8, FP8_E4M3.onnx_type: FP8_E4M3}
    inits = _inits(model)
    for node in _weight_dqs(model):
        quantized, scale = inits[node.input[0]], numpy_helper.to_array(inits[node.input[1]])
        if scale.size < 2 or quantized.data_type not in fmt_of:
            continue
        fmt = fmt_of[quantized.data_type]
        values = _dequantized_weight(node, inits)
        one = weight_scales(values, None, fmt)
        _set(model, node.input[0], fmt.quantize(values / one))
        _set(model, node.input[1], np.full_like(scale, one))


def _biased(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    inits = _inits(model)
    return [n for n in model.graph.node if n.op_type in ("Conv", "Gemm") and len(n.input) > 2 and n.input[2] in inits]


@operator("bias_dropped", "precision")
def bias_dropped(model: onnx.ModelProto, site: str) -> None:
    """One layer's bias lost (zeros)."""
    node = _pick(_biased(model), site)
    _set(model, node.input[2], np.zeros_like(numpy_helper.to_array(_inits(model)[node.input[2]])))


@operator("bias_doubled", "precision")
def bias_doubled(model: onnx.ModelProto, site: str) -> None:
    """One layer's bias applied twice."""
    node = _pick(_biased(model), site)
    _set(model, node.input[2], 2 * numpy_helper.to_array(_inits(model)[node.input[2]]))


@operator("layer_unquantized", "precision")
def layer_unquantized(model: onnx.ModelProto, site: str) -> None:
    """One weighted layer silently left in float: its inputs bypass their Q/DQ pairs."""
    producers = {out: n for n in model.graph.node for out in n.output}
    inits = _inits(model)
    quantized = [n for n in model.graph.node if n.op_type in WEIGHTED_OPS
                 and any(producers.get(i) is not None and producers[i].op_type == "DequantizeLinear" for i in n.input)]
    node = _pick(quantized, site)
    for index, name in enumerate(list(node.input)):
        dq = producers.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        if dq.input[0] in inits:  # a weight: store it dequantized, in float
            float_name = f"{dq.input[0]}_float"
            model.graph.initializer.append(numpy_helper.from_array(_dequantized_weight(dq, inits), float_name))
            node.input[index] = float_name
        else:  # an activation: read the tensor before its QuantizeLinear
            node.input[index] = producers[dq.input[0]].input[0]


@operator("calibration_normalisation", "calibration")
def calibration_normalisation(batches: list[Batch], site: str, factor: float = 4.0) -> list[Batch]:
    """Calibration inputs normalised differently from what the model sees (× factor)."""
    return [{k: (v * factor).astype(v.dtype) if np.issubdtype(v.dtype, np.floating) else v for k, v in b.items()}
            for b in batches]


@operator("fp16_overflow_rescale", "fp32")
def fp16_overflow_rescale(model: onnx.ModelProto, site: str, exponent: int = 16) -> None:
    """An FP32-equivalent rescale: one layer's weights and bias × 2^e, the next layer's weights × 2^-e
    (exact through ReLU and pooling), so FP32 outputs are unchanged and FP16 overflows."""
    inits = _inits(model)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    pairs = []
    for first in model.graph.node:
        if first.op_type not in ("Conv", "Gemm") or first.input[1] not in inits:
            continue
        tensor = first.output[0]
        while len(consumers.get(tensor, [])) == 1 and consumers[tensor][0].op_type in HOMOGENEOUS:
            tensor = consumers[tensor][0].output[0]
        nxt = consumers.get(tensor, [])
        if len(nxt) == 1 and nxt[0].op_type in ("Conv", "Gemm") and nxt[0].input[0] == tensor and nxt[0].input[1] in inits:
            pairs.append((first, nxt[0]))
    first, second = _pick(pairs, site)
    scale = np.float32(2.0 ** exponent)
    for name, factor in [(first.input[1], scale), (second.input[1], 1 / scale)] + \
            ([(first.input[2], scale)] if len(first.input) > 2 and first.input[2] in inits else []):
        _set(model, name, numpy_helper.to_array(inits[name]) * factor)
