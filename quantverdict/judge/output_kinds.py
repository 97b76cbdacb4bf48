"""What each output of a model is, so that it is judged by bounds that fit it.

A logits bound (``max_norm_err``: the worst element's error over the largest value) fails a probability map for
one flipped position among thousands: an OCR recogniser's per-position softmax showed 0.97 where its decoded text
agreed 98.8%. So an output is read off the FP32 graph, through ops that only move values:
- ``distribution``: a Softmax over its last axis (one distribution per position): judged by cosine and by which
  entry wins at each position (``min_top1``, per position), not by its worst element;
- ``probabilities``: a Sigmoid, or a Softmax over another axis (a probability or mask map): judged by cosine;
- ``labels``: an output of integers or booleans (an ArgMax's class ids, TopK's indices, a mask): each element a
  decision, judged by the share of elements equal to FP32's (``min_top1``), not by how far an id is from another
  (FP16 changed 6 of 8192 of piper's diacritizer's ids, and failed it on ``max_norm_err`` at 0.93);
- ``logits``: anything else (the defaults);
- ``detections``: a one-stage detector's raw head, declared only (:mod:`quantverdict.judge.detections`).
A manifest declares a kind per output where the graph does not show it (``output_kinds: {mask: probabilities}``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import onnx

from quantverdict.judge.tolerances import OutputKind
from quantverdict.precision.graph import int_attribute

if TYPE_CHECKING:
    from quantverdict.judge.workbench import Workbench

MOVES = frozenset({"Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Cast"})


def _kind(producer: Mapping[str, onnx.NodeProto], name: str, rank: int | None) -> OutputKind:
    node = producer.get(name)
    while node is not None and node.op_type in MOVES and node.input:
        if node.op_type not in ("Cast", "Identity"):
            rank = None  # a reshape between the Softmax and the output: its axis is no longer the output's last
        node = producer.get(node.input[0])
    if node is None:
        return "logits"
    if node.op_type == "Sigmoid":
        return "probabilities"
    if node.op_type == "Softmax":
        axis = int_attribute(node, "axis", -1)
        return "distribution" if axis == -1 or (rank is not None and axis == rank - 1) else "probabilities"
    return "logits"


def _decisions(value: onnx.ValueInfoProto) -> bool:
    """Whether graph output ``value`` holds integers or booleans."""
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.elem_type:
        return False
    dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    return dtype.kind in "iub"


def output_kinds(model: onnx.ModelProto, declared: Mapping[str, str] | None = None) -> dict[str, OutputKind]:
    """Each graph output's kind, read off the graph, a declared kind taking precedence."""
    producer = {out: node for node in model.graph.node for out in node.output}
    kinds: dict[str, OutputKind] = {}
    for value in model.graph.output:
        shape = value.type.tensor_type.shape if value.type.HasField("tensor_type") else None
        rank = len(shape.dim) if shape is not None and shape.dim else None
        kinds[value.name] = "labels" if _decisions(value) else _kind(producer, value.name, rank)
    for name, kind in (declared or {}).items():
        kinds[name] = kind  # type: ignore[assignment]
    return kinds


def measured(outputs: Sequence[str], kinds: Mapping[str, str]) -> str:
    """The output whose SNR a recipe search scores and a ranking orders layers by: the first of ``outputs`` holding no
    decisions (how far one id is from another is no error: piper's diacritizer declares its ids first), else the
    first."""
    return next((name for name in outputs if kinds.get(name) != "labels"), outputs[0])


def measured_output(store: "Workbench", model: str) -> str:
    """:func:`measured` of ``model``'s declared outputs in ``store``."""
    return measured(store.spec(model).outputs, store.output_kinds(model))
