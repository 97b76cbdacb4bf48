"""Graphs as other exporters write them, made from torch's exports by the rewrites those converters apply:
every weight a ``Constant`` node with no initializers (TensorFlow's and Paddle's converters, opset 11/12, IR
7/8), FP16 weights behind a ``Cast``, matrix weights stored transposed behind a ``Transpose``, unnamed nodes,
and external data. Each rewrite keeps the graph's function (up to FP16's rounding of the weights, for ``Cast``)."""
from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def torch_export(module, args: tuple, names: list[str], outputs: list[str], opset: int,
                 dynamic: dict | None = None) -> onnx.ModelProto:
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, buffer, input_names=names, output_names=outputs, opset_version=opset,
                          dynamo=False, dynamic_axes=dynamic or {name: {0: "batch"} for name in names})
    return onnx.load_from_string(buffer.getvalue())


def weights_as_constants(model: onnx.ModelProto, fp16_behind_cast: bool = False,
                         transposed_matrices: bool = False, unnamed: bool = False) -> onnx.ModelProto:
    """``model`` with every initializer moved into a ``Constant`` node; optionally weights of rank ≥ 2 stored in
    FP16 behind a ``Cast`` to FP32, matrices stored transposed behind a ``Transpose``, and every node unnamed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for init in out.graph.initializer:
        values = numpy_helper.to_array(init)
        stored, name = values, init.name
        if transposed_matrices and values.ndim == 2 and values.dtype == np.float32:
            nodes.append(helper.make_node("Transpose", [f"{name}_t"], [name], perm=[1, 0]))
            stored, name = values.T.copy(), f"{name}_t"
        if fp16_behind_cast and values.ndim >= 2 and values.dtype == np.float32:
            nodes.append(helper.make_node("Cast", [f"{name}_h"], [name], to=TensorProto.FLOAT))
            stored, name = stored.astype(np.float16), f"{name}_h"
        nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(stored, name)))
    del out.graph.initializer[:]
    inputs = [value for value in out.graph.input if value.name not in {init.name for init in model.graph.initializer}]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    every = list(reversed(nodes)) + list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(every)
    if unnamed:
        for node in out.graph.node:
            node.name = ""
    onnx.checker.check_model(out)
    return out


def save_external(model: onnx.ModelProto, path: Path) -> Path:
    """``model`` saved with its weights in a data file beside it (what exporters write past 2 GB)."""
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=0)
    return path
