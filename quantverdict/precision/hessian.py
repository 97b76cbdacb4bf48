"""GPTQ's H: Σ x xᵀ over each weighted layer's input column vectors (a Conv's unfolded patches) on the
calibration set, measured on the FP32 graph's activations.

H depends only on the FP32 graph and the calibration batches, not on what else a recipe quantizes, so it is
measured once for every layer GPTQ can round (within ``MEASURED_BYTES``) and kept for the process: ranking layers
one at a time for fallback, each rounded by GPTQ alone, then costs one forward pass, not one per layer. Sums are in
float64: float32 sums move with the BLAS kernel (a last-bit change moved 3084 of EfficientNet-Lite0's 4.67M rounded
weights; 4 in float64). Float64 sums still move in their last bits with the CPU's BLAS code path (most of
MobileNetV2's H between an EPYC and QEMU's Haswell, as do GPTQ's factorizations), which its rounding almost always
absorbs (the same MobileNetV2 graph on both), not always.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np
import onnx

from quantverdict.capabilities import physical_memory
from quantverdict.hashing import content_hash
from quantverdict.models.spec import Batch
from quantverdict.precision.batch_sets import batch_keys, batches_hash, siblings, union
from quantverdict.precision.calibrate import tensor_values
from quantverdict.precision.graph import ints_attribute
from quantverdict.precision.kept_bytes import KeptBytes
from quantverdict.precision.matrix_device import held, matrix_key, torch_device
from quantverdict.precision.pools import loaded_torch
from quantverdict.precision.rescaling import Rescaling

if TYPE_CHECKING:
    import torch

UNFOLDED_VALUES = 1 << 25  # values of unfolded input held at once (256 MB in float64)
# H kept over all (FP32 graph, calibration set) pairs, a graph's all measured at once if they fit: an eighth of the
# machine's memory, at most 4 GiB. A search's folds and its whole set are five pairs: a T5-small-sized encoder's take
# 1.2 GB, and at 1 GiB each was measured again for every candidate (35 s of its 284 s INT8 lock on 2 cores).
MEASURED_BYTES = min(1 << 32, (physical_memory() or 1 << 33) // 8)
Moments = tuple[np.ndarray, int]  # H ([groups, columns, columns]) and the input vectors summed into it, per group
_MEASURED: KeptBytes[dict[tuple, Moments]] = KeptBytes(MEASURED_BYTES,
                                                       lambda sums: sum(h.nbytes for h, _ in sums.values()))


@dataclass(frozen=True)
class LayerInputs:
    """How a weighted layer's input becomes the column vectors its weight multiplies (what H sums over)."""

    node: onnx.NodeProto  # in the FP32 graph
    shape: tuple[int, ...]  # the weight's, as stored
    groups: int
    columns: int  # inputs per output within a group: H is [groups, columns, columns]

    @property
    def key(self) -> tuple:
        """Layers reading one tensor with equal keys (a transformer's Q, K and V) share H."""
        if self.node.op_type != "Conv":
            return (self.node.input[0],)
        return (self.node.input[0], self.shape[1:], self.groups,
                *[(a.name, tuple(a.ints)) for a in self.node.attribute if a.ints])

    @property
    def hessian_bytes(self) -> int:
        return self.groups * self.columns * self.columns * 8


def measured(fp32: onnx.ModelProto, asked: Sequence[LayerInputs], batches: Sequence[Batch],
             every: Callable[[], list[LayerInputs]], shared: bool = False) -> tuple[str, dict[tuple, Moments]]:
    """H and vector count of each layer ``asked`` for (by :attr:`LayerInputs.key`), from those kept for ``fp32`` and
    ``batches``; where one is missing, ``every()`` layer is measured in one pass (those asked for alone where all
    would take more than ``MEASURED_BYTES``), with a search's other sets where ``shared`` or asked before
    (:func:`~quantverdict.precision.batch_sets.siblings`). First, the content hash of ``fp32`` and ``batches``."""
    model = fp32.SerializeToString()
    return _measured(model, content_hash(model), asked, batches, every, shared)


def _measured(model: bytes, graph: str, asked: Sequence[LayerInputs], batches: Sequence[Batch],
              every: Callable[[], list[LayerInputs]], shared: bool) -> tuple[str, dict[tuple, Moments]]:
    """:func:`measured` of the serialized graph ``model`` (``graph``: its content hash)."""
    key = _pair_key(graph, batches)
    kept = _kept(key)
    missing = {inputs.key: inputs for inputs in asked if inputs.key not in kept}
    if missing:
        others = {inputs.key: inputs for inputs in every() if inputs.key not in kept}
        if sum(inputs.hessian_bytes for inputs in {**others, **missing}.values()) <= MEASURED_BYTES:
            missing = {**others, **missing}
        layers = list(missing.values())
        asked_of, *beside = siblings(batches, graph, shared)  # a search's folds, where all fit too
        others = [(_pair_key(graph, found), found) for found in beside]
        sets = [(key, asked_of), *((each, found) for each, found in others
                                   if not all(layer.key in (_MEASURED.get(each) or {}) for layer in layers))]
        if len(sets) > 1 and len(sets) * sum(layer.hessian_bytes for layer in layers) > MEASURED_BYTES:
            sets = sets[:1]
        for (each, _), sums in zip(sets, _second_moment_sums(model, layers, [found for _, found in sets])):
            _kept(each).update(sums)
    out = {inputs.key: kept[inputs.key] for inputs in asked}
    _MEASURED.trim()  # the least recently used pairs' go
    return key, out


def second_moments(fp32: onnx.ModelProto, asked: Sequence[LayerInputs], batches: Sequence[Batch],
                   every: Callable[[onnx.ModelProto], list[LayerInputs]], rescaling: Rescaling | None = None
                   ) -> tuple[str, list[Moments], list[tuple[str, list[Moments]]]]:
    """H and vector count of each layer ``asked`` for: :func:`derived` from the graph before ``fp32``'s preparation
    where ``rescaling`` says how it was prepared, else :func:`measured` on ``fp32`` (``every``: a graph's layers to
    measure in the same pass; with a search's other sets where ``fp32`` is unprepared, as every set's H is asked of
    it); first, the content hash of what they are of; last, where ``fp32`` is unprepared, the same of each other set
    of a search that holds ``batches`` whose H is kept (:func:`_kept_beside`)."""
    found = None if rescaling is None else derived(rescaling, asked, batches, every)
    if found is not None:
        return (*found, [])
    model, unprepared = fp32.SerializeToString(), rescaling is None
    graph = content_hash(model)
    key, sums = _measured(model, graph, asked, batches, lambda: every(fp32), shared=unprepared)
    return key, [sums[inputs.key] for inputs in asked], _kept_beside(graph, asked, batches) if unprepared else []


def _kept_beside(graph: str, asked: Sequence[LayerInputs],
                 batches: Sequence[Batch]) -> list[tuple[str, list[Moments]]]:
    """For each other set of a search that holds ``batches`` (:func:`~quantverdict.precision.batch_sets.siblings`)
    whose H of every layer ``asked`` is kept for the graph ``graph`` (its content hash; a search's first pass measures
    every set's): the content hash of that pair and the H. Nothing is measured. Not a set holding all of ``batches``
    (the whole, asked of a fold): only a chosen recipe is made of it (its rounding, a fifth of a candidate's, waits)."""
    found, mine = [], set(batch_keys(batches))
    for others in siblings(batches, graph, shared=True)[1:]:
        key = _pair_key(graph, others)
        kept = None if mine <= set(batch_keys(others)) else _MEASURED.get(key)
        if kept is not None and all(inputs.key in kept for inputs in asked):
            found.append((key, [kept[inputs.key] for inputs in asked]))
    return found


def derived(rescaling: Rescaling, asked: Sequence[LayerInputs], batches: Sequence[Batch],
            every: Callable[[onnx.ModelProto], list[LayerInputs]]) -> tuple[str, list[Moments]] | None:
    """H and vector count of each layer ``asked`` for (of a prepared graph), measured on the graph before its
    preparation and rescaled where the preparation rescaled its input (:mod:`quantverdict.precision.rescaling`): one
    measurement for every preparation of that graph. First, the content hash of what they are of. None where a layer
    or its input is not found there as the preparation recorded it (then measure the prepared graph)."""
    before = {node.output[0]: node for node in rescaling.before.graph.node if node.output}
    sources, factors = [], []
    for inputs in asked:
        node, rescale = before.get(inputs.node.output[0]), rescaling.tensors.get(inputs.node.input[0])
        if node is None or node.input[0] != (rescale.source if rescale else inputs.node.input[0]):
            return None
        factor = None if rescale is None else _column_factors(inputs, rescale.factor)
        if rescale is not None and factor is None:
            return None
        sources.append(LayerInputs(node, inputs.shape, inputs.groups, inputs.columns))
        factors.append(factor)
    graph, sums = measured(rescaling.before, sources, batches, lambda: every(rescaling.before), shared=True)
    out = []
    for source, factor in zip(sources, factors):
        hessian, vectors = sums[source.key]
        out.append((hessian if factor is None else hessian * factor[:, :, None] * factor[:, None, :], vectors))
    key = content_hash(graph, sorted((name, rescale.source, rescale.factor)
                                     for name, rescale in rescaling.tensors.items()))
    return key, out


def _column_factors(inputs: LayerInputs, factor: np.ndarray) -> np.ndarray | None:
    """A per-channel factor of the layer's input as one per column of each group ([groups, columns]), in the order
    :class:`_Columns` lays them out (a Conv's channel-major patches); None where the channels do not match."""
    taps = int(np.prod(inputs.shape[2:])) if inputs.node.op_type == "Conv" else 1
    if factor.size * taps != inputs.groups * inputs.columns:
        return None
    return np.repeat(factor.reshape(inputs.groups, -1), taps, axis=1)


def _pair_key(graph: str, batches: Sequence[Batch]) -> str:
    """The key of a (graph, batches) pair's H: the device's too, whose float64 sums move in their last bits."""
    return content_hash(graph, batches_hash(batches), matrix_key())


def _kept(key: str) -> dict[tuple, Moments]:
    """The H kept for the (graph, batches) pair ``key``: a new, empty entry where there is none."""
    kept = _MEASURED.get(key)
    if kept is None:
        kept = {}
        _MEASURED.put(key, kept)
    return kept


def _second_moment_sums(model: bytes, layers: list[LayerInputs],
                        sets: Sequence[Sequence[Batch]]) -> list[dict[tuple, Moments]]:
    """For each set of batches, Σ x xᵀ over every input column vector (a Conv's unfolded patches) of each layer, and
    their number, in one pass over the batches the sets hold (each batch's added to every set holding it, in that
    set's order: the same sums as its own pass)."""
    order, holders = union(sets)
    sums = MomentSums(model, layers, len(sets))
    for index, values in tensor_values(model, sums.tensors, order):
        sums.add(holders[index], values)
    return sums.sums


class MomentSums:
    """Each of several sets' H and vector count of ``layers`` (of the graph ``model``), a batch at a time; a
    :class:`~quantverdict.precision.riders.Rider` of the graph's calibration pass, which keeps them where
    :func:`measured` looks first."""

    def __init__(self, model: bytes, layers: Sequence[LayerInputs], sets: int):
        self.graph, self.layers = content_hash(model), list(layers)
        self.tensors = list(dict.fromkeys(layer.node.input[0] for layer in layers))
        self.sums: list[dict[tuple, Moments]] = [{} for _ in range(sets)]
        self._columns = _Columns()

    def add(self, holding: Sequence[int], values: Mapping[str, np.ndarray]) -> None:
        present = [layer for layer in self.layers if layer.node.input[0] in values]  # the others: in another part of
        # the tensors (each layer meets the batches in their order all the same)
        if not present:
            return
        with held(self._columns.device):  # the GPU's timing slot once for the batch, not once per layer
            for layer in present:
                product, vectors = _second_moments(layer, values[layer.node.input[0]], self._columns)
                for number in holding:  # in place: a new sum per set and batch was 3.8 GB written for the 35M encoder
                    total, count = self.sums[number].get(layer.key, (None, 0))
                    total = 0.0 + product if total is None else np.add(total, product, out=total)  # 0.0 +: as begun
                    self.sums[number][layer.key] = (total, count + vectors)

    def keep(self, sets: Sequence[Sequence[Batch]]) -> None:
        for batches, sums in zip(sets, self.sums):
            _kept(_pair_key(self.graph, batches)).update(sums)
        self._columns = _Columns()  # its buffer, the size of the largest layer's unfolded input
        _MEASURED.trim()


def _second_moments(layer: LayerInputs, value: np.ndarray, columns: "_Columns") -> Moments:
    """Σ x xᵀ over the layer's input column vectors, and their number, a few samples at a time: a
    Conv's unfolded patches are its kernel size times the size of its input."""
    taps = int(np.prod(layer.shape[2:])) if layer.node.op_type == "Conv" else 1
    step = max(1, UNFOLDED_VALUES // max(1, value[0].size * taps))
    total, vectors = np.zeros(()), 0
    for start in range(0, len(value), step):
        unfolded = columns.of(layer, value[start:start + step])
        total = total + (unfolded @ unfolded.transpose(1, 2)).cpu().numpy()
        vectors += unfolded.shape[2]
    return total, vectors


class _Columns:
    """A layer's input as [groups, columns, vectors] in float64, in the column order of its reshaped weight, written
    into one buffer kept for a pass: unfolding, grouping and widening each into a tensor of their own was fresh
    memory the kernel mapped page by page for every layer of every batch (on MobileNetV2's first depthwise layer,
    unfold, regroup and widen took 143 ms against 30 ms for the sums). Each column is a row of the buffer, so a
    Conv's is copied from its input a row of the image at a time (vectors by column, a depthwise layer's 9 values
    apart, took MobileNetV2's H twice as long)."""

    def __init__(self) -> None:
        self._buffer: "torch.Tensor | None" = None
        self._device: "torch.device | None" = None

    @property
    def device(self) -> "torch.device":
        """Where the columns and their products are (:mod:`quantverdict.precision.matrix_device`), asked once."""
        if self._device is None:
            self._device = torch_device()
        return self._device

    def of(self, layer: LayerInputs, value: np.ndarray) -> "torch.Tensor":
        torch = loaded_torch()

        x = torch.from_numpy(np.ascontiguousarray(value, np.float32)).to(self.device)
        windows = _windows(layer, x).permute(
            0, 4, 5, 6, 1, 2, 3)  # [groups, channels of a group, kernel height, kernel width, samples, rows, columns]
        groups, width, vectors = windows.shape[0], int(np.prod(windows.shape[1:4])), int(np.prod(windows.shape[4:]))
        size = groups * vectors * width
        if self._buffer is None or self._buffer.numel() < size:
            self._buffer = torch.empty(size, dtype=torch.float64, device=self.device)
        columns = self._buffer[:size]
        columns.view(windows.shape).copy_(windows)
        return columns.view(groups, width, vectors)


def _windows(layer: LayerInputs, x: "torch.Tensor") -> "torch.Tensor":
    """A view of the layer's input ``x`` as [groups, samples, rows, columns, channels of a group, kernel height,
    kernel width]: the column vectors, by position, of a Conv (a 1-D one as a 2-D one of height 1; a Gemm or MatMul
    as a 1 × 1 convolution of one group over its rows), laid out as unfold lays them out."""
    torch = loaded_torch()

    node = layer.node
    if node.op_type != "Conv":
        rows = x.reshape(-1, x.shape[-1])
        (count, width), (down, across) = rows.shape, rows.stride()
        return rows.as_strided((1, 1, count, 1, width, 1, 1), (0, 0, down, 0, across, 0, 0))
    flat = x.ndim == 3
    kernel = (1, *layer.shape[2:]) if flat else layer.shape[2:]
    pads = ints_attribute(node, "pads", [0] * (2 * len(kernel)))
    top, left, bottom, right = (0, pads[0], 0, pads[1]) if flat else pads
    strides = ints_attribute(node, "strides", [1] * (x.ndim - 2))
    dilations = ints_attribute(node, "dilations", [1] * (x.ndim - 2))
    if flat:
        x, strides, dilations = x[:, :, None, :], [1, *strides], [1, *dilations]
    if any(pads):
        x = torch.nn.functional.pad(x, (left, right, top, bottom))
    samples, channels, height, width = x.shape
    rows, cols = [(size - dilation * (taps - 1) - 1) // stride + 1
                  for size, taps, stride, dilation in zip((height, width), kernel, strides, dilations)]
    per_group = channels // layer.groups
    n, c, h, w = x.stride()
    return x.as_strided((layer.groups, samples, rows, cols, per_group, *kernel),
                        (per_group * c, n, strides[0] * h, strides[1] * w, c, dilations[0] * h, dilations[1] * w))
