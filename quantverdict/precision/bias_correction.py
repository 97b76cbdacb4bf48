"""Empirical bias correction (Nagel et al. 2019, "Data-Free Quantization", §4.2): quantization
shifts the mean of a layer's output, and the shift adds up layer after layer (ReLU6 clips noise
asymmetrically, depthwise layers have few terms to average it out). For each quantized Conv or
Gemm with a bias, in graph order, the per-channel mean of its output over the calibration set is
measured in the FP32 graph and in the quantized graph with the layers before it already corrected,
and the difference is taken off its bias. (Correcting all layers at once over-corrects: each
layer's shift includes what the layers before it add.) Means are reduced inside the graph (a
ReduceMean per layer) and the biases are fed as inputs, so one ONNX Runtime session serves every
step and runs only the part of the graph up to the layer being corrected.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantverdict.models.spec import Batch, sample_count
from quantverdict.precision.exposing import as_written_session
from quantverdict.precision.graph import use_counts


def correct_biases(quantized: onnx.ModelProto, fp32: onnx.ModelProto, batches: Sequence[Batch]) -> onnx.ModelProto:
    """``quantized`` with the bias of every quantized Conv/Gemm shifted so that its output's
    per-channel mean over ``batches`` is FP32's; both graphs name the layers' outputs alike."""
    graph = quantized.graph
    dequantized = {out for node in graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    initializers = {init.name: init for init in graph.initializer}
    uses = use_counts(graph)
    layers = {node.output[0]: node.input[2] for node in graph.node
              if node.op_type in ("Conv", "Gemm") and len(node.input) > 2 and node.input[1] in dequantized
              and node.input[2] in initializers and uses[node.input[2]] == 1}
    if not layers:
        return quantized
    target = _means_session(fp32, list(layers), [])
    reference = {t: v for t, v in zip(layers, target(list(layers), batches, {}))}
    biases = {name: numpy_helper.to_array(initializers[name]).astype(np.float32) for name in layers.values()}
    current = _means_session(quantized, list(layers), list(biases))
    for output, bias in layers.items():  # graph order: the layers before this one are corrected
        [mean] = current([output], batches, biases)
        biases[bias] = (biases[bias] - (mean - reference[output])).astype(np.float32)
    for name, values in biases.items():
        initializers[name].CopyFrom(numpy_helper.from_array(values, name))
    return quantized


def _means_session(model: onnx.ModelProto, tensors: list[str], fed: list[str]):  # type: ignore[no-untyped-def]
    """A function (tensors, batches, fed values) → per-channel (axis 1) means of those tensors over
    the batches, from one session over ``model`` with ReduceMean outputs added and the initializers
    named in ``fed`` turned into inputs."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    graph = probe.graph
    opset = next((o.version for o in probe.opset_import if o.domain in ("", "ai.onnx")), 17)
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*onnx.shape_inference.infer_shapes(probe).graph.value_info, *graph.output]}
    for init in [i for i in graph.initializer if i.name in fed]:
        graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        graph.initializer.remove(init)
    for tensor in tensors:
        axes = [a for a in range(ranks.get(tensor, 4)) if a != 1]
        if opset >= 18:
            graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), f"{tensor}__mean_axes"))
            graph.node.append(helper.make_node("ReduceMean", [tensor, f"{tensor}__mean_axes"], [f"{tensor}__mean"],
                                               keepdims=0))
        else:
            graph.node.append(helper.make_node("ReduceMean", [tensor], [f"{tensor}__mean"], axes=axes, keepdims=0))
        graph.output.append(onnx.ValueInfoProto(name=f"{tensor}__mean"))
    session = as_written_session(probe)

    def means(wanted: list[str], batches: Sequence[Batch], values: dict[str, np.ndarray]) -> list[np.ndarray]:
        sums, count = [np.zeros(1)] * len(wanted), 0
        for batch in batches:
            size = sample_count(batch)
            outputs = session.run([f"{t}__mean" for t in wanted], {**batch, **values})
            sums = [s + o.astype(np.float64) * size for s, o in zip(sums, outputs)]
            count += size
        return [s / count for s in sums]

    return means
