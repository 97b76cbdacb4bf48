"""ONNX graphs every ONNX Runtime in use can read, and at the opset a recipe needs.

- IR version: onnx writes its own newest IR version (onnx 1.23: IR 14), which older runtimes refuse
  ("Unsupported model IR version: 14, max supported IR version: 13": onnxruntime 1.30). A graph needs
  only the IR version of its opsets and data types, so every graph the harness writes, and every
  user file above that, is given the lowest one that holds it: the same bytes on every machine,
  read by every runtime that knows the opset.
- Opset: float8 QuantizeLinear/DequantizeLinear need opset 19, per-axis ones 13; a graph exported
  at a lower opset (17 and 18 are what most exporters and tutorials write) is converted with
  ``onnx.version_converter``, or refused naming the opset it has and the one it needs.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from quantverdict.errors import ModelFileError

# IR version that introduced each data type (onnx/onnx.proto3's comments on TensorProto.DataType)
_DTYPE_IR = {TensorProto.FLOAT8E4M3FN: 9, TensorProto.FLOAT8E4M3FNUZ: 9, TensorProto.FLOAT8E5M2: 9,
             TensorProto.FLOAT8E5M2FNUZ: 9, TensorProto.UINT4: 10, TensorProto.INT4: 10}
for _name, _ir in (("FLOAT4E2M1", 11), ("FLOAT8E8M0", 12)):  # newer onnx releases only
    if hasattr(TensorProto, _name):
        _DTYPE_IR[getattr(TensorProto, _name)] = _ir


def lowest_ir(model: onnx.ModelProto) -> int:
    """The lowest IR version that holds ``model``'s opsets and data types."""
    opsets = [entry for entry in model.opset_import if (entry.domain or "") in ("", "ai.onnx", "ai.onnx.ml")]
    needed = helper.find_min_ir_version_for(opsets, ignore_unknown=True) if opsets else 3
    return max([needed, *(_DTYPE_IR.get(dtype, 0) for dtype in _dtypes(model.graph))])


def _dtypes(graph: onnx.GraphProto) -> set[int]:
    found = {init.data_type for init in graph.initializer}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.HasField("tensor_type"):
            found.add(value.type.tensor_type.elem_type)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                found.add(attribute.t.data_type)
            elif attribute.type == onnx.AttributeProto.INT and attribute.name in ("to", "output_dtype"):
                found.add(attribute.i)
            elif attribute.type == onnx.AttributeProto.GRAPH:
                found |= _dtypes(attribute.g)
    return found


def with_lowest_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (changed in place) at the lowest IR version that holds it, if that is lower."""
    model.ir_version = min(model.ir_version or onnx.IR_VERSION, lowest_ir(model))
    return model


def serialized(model: onnx.ModelProto) -> bytes:
    """The bytes the harness writes for a graph: at the lowest IR version that holds it."""
    return with_lowest_ir(model).SerializeToString()


def make_model(graph: onnx.GraphProto, opset: int = 19) -> onnx.ModelProto:
    """``onnx.helper.make_model`` at ``opset`` and the lowest IR version that holds it."""
    return with_lowest_ir(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def opset_of(model: onnx.ModelProto) -> int:
    return next((entry.version for entry in model.opset_import if (entry.domain or "") in ("", "ai.onnx")), 0)


def at_opset(model: onnx.ModelProto, needed: int, why: str, where: str) -> onnx.ModelProto:
    """``model`` if its default-domain opset is ``needed`` or more, else converted to ``needed``; a graph
    the converter cannot take is refused naming ``where``, the opset it has and the one ``why`` needs."""
    have = opset_of(model)
    if have >= needed:
        return model
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, needed)
        onnx.checker.check_model(converted)
    except Exception as exc:  # the converter raises RuntimeError, ValidationError, IndexError…
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelFileError(f"{where} is at opset {have}; {why} needs opset {needed}, and onnx's version "
                             f"converter could not convert it ({first}): export it at opset {needed} or later") \
            from exc
    return with_lowest_ir(converted)
