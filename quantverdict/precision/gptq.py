"""Weight rounding that minimizes each layer's output error (GPTQ: Frantar et al. 2023, from Optimal
Brain Quantization, Frantar & Alistarh 2022), instead of rounding every weight to its nearest grid value.

Round-to-nearest makes each weight's error small but lets the errors add up in the layer's output.
Where a layer's inputs are correlated, as neighbouring pixels of a natural image are, they add up
badly: a trained depthwise filter whose taps nearly cancel (an edge detector with a large gain
folded in from batch norm) sees an almost constant patch, and its output error is the sum of its
taps' rounding errors times that constant. GPTQ rounds one input column at a time and moves the
columns not yet rounded to absorb the error, weighted by the inputs' second moments
H = E[x xᵀ] measured on the calibration set; so the output error over those inputs is what gets
minimized. The grid and the scales are the recipe's own (per-channel amax with INT8 or E4M3; NVFP4's
E2M1 with its blocks' scales): only which grid value each weight takes changes, so the graph keeps its
layout and TensorRT runs it alike.

H is measured on the FP32 graph's inputs of each layer (the recipe's prepared graph), columns are
taken in order of decreasing H diagonal ("act order") and H is damped by 1% of its mean diagonal,
as GPTQ's reference does. Conv (1-D and 2-D, explicit pads, any group count), Gemm (``transA`` 0) and
MatMul with a constant 2-D weight are rounded this way; any other quantized layer keeps nearest, as
does one with more than ``MAX_COLUMNS`` inputs per output, or with fewer calibration input vectors than
inputs (H singular: GPTQ would fit the calibration set, not the layer); a warning names it. H is measured
once per FP32 graph and calibration set, for every layer (:mod:`quantverdict.precision.hessian`), a prepared graph's
derived from the graph before its preparation (:mod:`quantverdict.precision.rescaling`).

A layer's rounding is a function of H, its weight, its scales and the grid alone, not of the activations' ranges:
recipes that differ only in their calibrator round every weight alike, so each layer's grid values are kept for the
process (``ROUNDED_BYTES``), as H is. A search tries three calibrators with GPTQ on every fold: MiniLM-L6's INT8
search rounded 16 times, 5 of them distinct.
"""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, replace
from typing import Callable, Hashable, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from quantverdict.models.spec import Batch
from quantverdict.precision.graph import int_attribute
from quantverdict.precision.gptq_columns import Quantize, rounded_columns
from quantverdict.precision.grids import stored_format
from quantverdict.precision.hessian import LayerInputs, second_moments
from quantverdict.precision.kept_bytes import KeptBytes
from quantverdict.precision.pools import loaded_torch
from quantverdict.precision.rescaling import Rescaling

MAX_COLUMNS = 16384  # inputs per output of a layer GPTQ rounds (H in float64: 2 GiB)
STACK_BYTES = 1 << 28  # H of the layers of one shape rounded in one pass (256 MiB; a larger one alone)
ROUNDED_BYTES = 1 << 30  # grid values kept, by FP32 graph and calibration set, layer, scales and grid (float32: exact)
_ROUNDED: KeptBytes[np.ndarray] = KeptBytes(ROUNDED_BYTES, lambda grid: grid.nbytes)


@dataclass
class _Layer:
    """One quantized weighted layer: where its rounded weight lives and how its input becomes columns."""

    node: onnx.NodeProto  # in the FP32 graph
    store: Callable[[np.ndarray], None]  # writes grid values (in units of ``scale``, weight layout) back
    quantize: Quantize  # onto its format's grid
    scale: np.ndarray  # the weight's scale, shaped to broadcast against it
    weight: np.ndarray  # FP32, as stored
    rows: Callable[[np.ndarray], np.ndarray]  # stored weight → [groups, rows, columns]
    back: Callable[[np.ndarray], np.ndarray]  # the inverse
    groups: int
    hessian: np.ndarray | None = None  # [groups, columns, columns], summed over calibration inputs
    vectors: int = 0  # input column vectors summed into it (per group)

    @property
    def inputs(self) -> LayerInputs:
        return LayerInputs(self.node, self.weight.shape, self.groups, self.rows(self.weight).shape[-1])


def round_weights(quantized: onnx.ModelProto, fp32: onnx.ModelProto, batches: Sequence[Batch],
                  rescaling: Rescaling | None = None) -> onnx.ModelProto:
    """``quantized`` with the stored weights of its Conv/Gemm/MatMul layers re-rounded by GPTQ, H from
    their inputs in ``fp32`` (found by the layer's output name: node names may be empty) over ``batches``, or from the
    graph before ``fp32``'s preparation (``rescaling``); each onto the grid of the format it is stored in (an INT8
    recipe's fallback layers may be FP8's)."""
    _round(_stored_layers(quantized, fp32), fp32, batches, rescaling)
    return quantized


def round_fake_quantized(quantized: onnx.ModelProto, fp32: onnx.ModelProto, batches: Sequence[Batch],
                         scales: Callable[[onnx.NodeProto, np.ndarray], np.ndarray | None],
                         quantize: Quantize) -> onnx.ModelProto:
    """As :func:`round_weights`, for a graph whose weights hold their dequantized values in float (FP4's
    simulation): ``scales(node, weight)`` gives each weight element's scale (its block's), or None for a
    layer left as is; the rounded weights are written back as grid values times those scales."""
    graph_weights = {init.name: init for init in quantized.graph.initializer}
    layers = []
    for node, original, weight in _twins(quantized, fp32):
        scale = scales(original, weight) if node.input[1] in graph_weights else None
        shapes = None if scale is None else _fitting_shapes(original, weight)
        if shapes is not None:
            init = graph_weights[node.input[1]]
            layers.append(_Layer(original, _writer(init, lambda grid, s=scale: (grid * s).astype(np.float32)),
                                 quantize, scale, weight, *shapes))
    _round(layers, fp32, batches)
    return quantized


def _writer(init: onnx.TensorProto, encode: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], None]:
    return lambda grid: init.CopyFrom(numpy_helper.from_array(encode(grid), init.name))


def _round(layers: list[_Layer], fp32: onnx.ModelProto, batches: Sequence[Batch],
           rescaling: Rescaling | None = None) -> None:
    """Every usable layer's weight re-rounded: layers of one shape in one pass over their columns (as groups of one
    weight: the loop over columns is Python's, and a transformer repeats a few shapes dozens of times), with the
    same layers of a search's other sets whose H is kept (its other folds and its whole set round the same weights of
    an unprepared graph: MobileNetV2's five in 2.6 s, where each alone took 0.8 s), kept for their turn; the same
    arithmetic per layer as rounding each alone."""
    if not layers:
        return
    graph, moments, beside = second_moments(fp32, [layer.inputs for layer in layers], batches, roundable, rescaling)
    by_shape: dict[tuple[Hashable, ...], list[tuple[_Layer, np.ndarray]]] = {}
    singular: list[tuple[onnx.NodeProto, int, int]] = []  # too few vectors: (layer, vectors, inputs)
    for index, (layer, (hessian, vectors)) in enumerate(zip(layers, moments)):
        key = (graph, layer.node.output[0], hashlib.sha256(layer.scale.tobytes()).hexdigest(), layer.quantize)
        rounded = _ROUNDED.get(key)
        if rounded is not None:
            layer.store(rounded.astype(np.float64))
            continue
        scaled = layer.rows(layer.weight.astype(np.float64) / layer.scale)
        if vectors < scaled.shape[-1]:  # H = XᵀX has rank at most the number of vectors
            singular.append((layer.node, vectors, scaled.shape[-1]))
        elif not np.isfinite(hessian).all():
            _keep_nearest(layer.node, f"its calibration inputs ({layer.node.input[0]!r}) are not finite", stacklevel=3)
        else:
            same = by_shape.setdefault((*scaled.shape[1:], layer.quantize), [])
            same.append((replace(layer, store=_kept(layer.store, key), hessian=hessian, vectors=vectors), scaled))
            for pair, sums in beside:  # a search's other sets, the same weights: rounded in this pass, kept for theirs
                theirs, (other, count) = (pair, *key[1:]), sums[index]
                if count >= scaled.shape[-1] and np.isfinite(other).all() and _ROUNDED.get(theirs) is None:
                    same.append((replace(layer, store=_kept(_unstored, theirs), hessian=other, vectors=count), scaled))
    _keep_nearest_singular(singular)
    for same in by_shape.values():
        for stack in _stacks(same):
            _round_stack(stack)


def _keep_nearest_singular(layers: list[tuple[onnx.NodeProto, int, int]]) -> None:
    """Warn once that the ``layers`` (each with its calibration input vectors and its inputs) keep nearest rounding,
    their H singular: a network's late layers see few vectors (RegNet's twenty-four 3 × 3 layers of 400 inputs, 384
    vectors on a fold's 24 samples), and a line for each was most of a lock's output."""
    if len(layers) == 1:
        node, vectors, inputs = layers[0]
        _keep_nearest(node, f"{vectors} calibration input vectors for {inputs} inputs make H singular (give it more "
                            "calibration data)", stacklevel=4)
    elif layers:
        named = ", ".join(f"{node.name or node.output[0]!r} ({vectors} for {width})" for node, vectors, width in layers)
        warnings.warn(f"GPTQ: {len(layers)} layers keep nearest rounding: fewer calibration input vectors than inputs "
                      f"make their H singular (give them more calibration data): {named}", stacklevel=4)


def _kept(store: Callable[[np.ndarray], None], key: Hashable) -> Callable[[np.ndarray], None]:
    """``store``, keeping the grid values it is given under ``key``."""
    def kept(grid: np.ndarray) -> None:
        _ROUNDED.put(key, grid.astype(np.float32))
        store(grid)
    return kept


def _unstored(grid: np.ndarray) -> None:
    """Where another set's grid values go beside being kept: nowhere (its graph takes them in its turn)."""


def _stacks(same: list[tuple[_Layer, np.ndarray]]) -> list[list[tuple[_Layer, np.ndarray]]]:
    """Layers of one shape in stacks whose H take at most :data:`STACK_BYTES` together (one at least)."""
    stacks: list[list[tuple[_Layer, np.ndarray]]] = [[]]
    size = 0
    for layer, scaled in same:
        assert layer.hessian is not None
        if stacks[-1] and size + layer.hessian.nbytes > STACK_BYTES:
            stacks.append([])
            size = 0
        stacks[-1].append((layer, scaled))
        size += layer.hessian.nbytes
    return stacks


def _round_stack(stack: list[tuple[_Layer, np.ndarray]]) -> None:
    """GPTQ over ``stack``'s layers at once (one shape, one grid); where one's H is unusable, each alone, so that one
    is named."""
    torch = loaded_torch()

    try:
        grids = np.split(rounded_columns(np.concatenate([scaled for _, scaled in stack]),
                                         np.concatenate([layer.hessian for layer, _ in stack]), stack[0][0].quantize),
                         np.cumsum([scaled.shape[0] for _, scaled in stack])[:-1])
    except torch.linalg.LinAlgError as error:
        if len(stack) == 1:
            _keep_nearest(stack[0][0].node, str(error), stacklevel=4)
            return
        for one in stack:
            _round_stack([one])
        return
    for (layer, _), grid in zip(stack, grids):
        layer.store(layer.back(grid))


def _keep_nearest(node: onnx.NodeProto, why: str, stacklevel: int) -> None:
    """Warn that ``node`` keeps nearest rounding and why, naming it by its name, else its output (exporters
    may leave names empty); ``stacklevel`` as seen from the caller."""
    warnings.warn(f"GPTQ: layer {node.name or node.output[0]!r} keeps nearest rounding: {why}",
                  stacklevel=stacklevel + 1)


def _twins(quantized: onnx.ModelProto,
           fp32: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto, np.ndarray]]:
    """Each weighted layer of ``quantized`` with its FP32 twin (same output name) and the twin's weight."""
    f_nodes = {node.output[0]: node for node in fp32.graph.node if node.output}  # outputs keep their names
    f_inits = {init.name: init for init in fp32.graph.initializer}
    out = []
    for node in quantized.graph.node:
        original = f_nodes.get(node.output[0]) if node.op_type in ("Conv", "Gemm", "MatMul") else None
        if original is not None and len(node.input) > 1 and original.input[1] in f_inits:
            out.append((node, original, numpy_helper.to_array(f_inits[original.input[1]]).astype(np.float32)))
    return out


def _fitting_shapes(node: onnx.NodeProto, weight: np.ndarray):  # type: ignore[no-untyped-def]
    """:func:`_shapes` for a layer GPTQ can round and whose H fits (else None, with a warning naming it)."""
    shapes = _shapes(node, weight.shape)
    if shapes is None:
        return None
    columns = shapes[0](weight).shape[-1]
    if columns > MAX_COLUMNS:
        _keep_nearest(node, f"{columns} inputs per output, more than {MAX_COLUMNS} (H would take "
                            f"{columns * columns * 8 / 2**30:.1f} GiB)", stacklevel=4)
        return None
    return shapes


def _stored_layers(quantized: onnx.ModelProto, fp32: onnx.ModelProto) -> list[_Layer]:
    """The layers of ``quantized`` that take a stored low-precision weight (through a DequantizeLinear), each with the
    grid of the format it is stored in."""
    q_inits = {init.name: init for init in quantized.graph.initializer}
    dq = {node.output[0]: node for node in quantized.graph.node if node.op_type == "DequantizeLinear"}
    layers = []
    for node, original, weight in _twins(quantized, fp32):
        source = dq.get(node.input[1])
        shapes = None if source is None or source.input[0] not in q_inits else _fitting_shapes(original, weight)
        if shapes is None:
            continue
        scale = numpy_helper.to_array(q_inits[source.input[1]]).astype(np.float64)
        if scale.size > 1:  # per channel, along the DequantizeLinear's axis
            shape = [1] * weight.ndim
            shape[int_attribute(source, "axis", 1)] = -1
            scale = scale.reshape(shape)
        quantize = stored_format(q_inits[source.input[0]].data_type).quantize
        layers.append(_Layer(original, _writer(q_inits[source.input[0]], quantize), quantize, scale, weight, *shapes))
    return layers


def _shapes(node: onnx.NodeProto, shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """(weight → [groups, rows, columns], its inverse, groups) for a layer GPTQ handles, else None."""
    if node.op_type == "Conv":
        if len(shape) not in (3, 4) or _auto_pad(node) not in ("NOTSET", "VALID"):
            return None
        groups = int_attribute(node, "group", 1)
        return (lambda w: w.reshape(groups, shape[0] // groups, -1)), (lambda g: g.reshape(shape)), groups
    if len(shape) != 2 or (node.op_type == "Gemm" and int_attribute(node, "transA", 0)):
        return None
    if node.op_type == "Gemm" and int_attribute(node, "transB", 0):  # [out, in]
        return (lambda w: w[None]), (lambda g: g[0]), 1
    return (lambda w: w.T[None]), (lambda g: g[0].T), 1  # [in, out]


def _auto_pad(node: onnx.NodeProto) -> str:
    return next((a.s.decode() for a in node.attribute if a.name == "auto_pad"), "NOTSET")


def roundable(fp32: onnx.ModelProto) -> list[LayerInputs]:
    """Every layer of ``fp32`` whose weight GPTQ can round, as the inputs its H is measured on."""
    out = []
    for _, node, weight in _twins(fp32, fp32):
        shapes = _shapes(node, weight.shape)
        columns = None if shapes is None else shapes[0](weight).shape[-1]
        if columns is not None and columns <= MAX_COLUMNS:
            out.append(LayerInputs(node, weight.shape, shapes[2], columns))
    return out
