"""Outputs of several batches joined sample by sample: along the axis that holds each batch's samples, moved first.

Every judgement reads an output's first axis as its samples (a sample's error, top-1 agreement, the bootstrap's
intervals, the search's paired test). Most outputs put the batch first, but not all: a recurrent layer's state is
``[layers × directions, batch, hidden]`` (PyTorch's, and ONNX's LSTM/GRU/RNN ``Y_h``), a sequence-first encoder's
output ``[time, batch, features]``. Joined on their first axis, their "samples" were layers or time steps of several
batches, and an error was paired with the wrong sample's.

The axis is read from each batch's shapes, so that every runtime's outputs are joined alike: the batch holds ``n``
samples (:func:`~quantverdict.models.spec.sample_count`: its inputs' first axis); an output whose first axis has
``n`` entries, or none of whose axes does (a scalar, a sum over the batch), is joined on its first axis, as before;
otherwise on its first axis with ``n`` entries in every batch, its other axes alike in all (a count that varies by
batch, as NonMaxSuppression's, is no sample axis).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from quantverdict.models.spec import Batch, sample_count

CODE = __name__  # the join's source, fingerprinted by every cache of joined outputs (judge's code does not hold it)


def sample_axis(shapes: Sequence[tuple[int, ...]], sizes: Sequence[int]) -> int:
    """The axis of an output that holds each batch's samples, from its shape in each batch (``shapes``) and the
    samples each batch holds (``sizes``): the first unless that one does not have them and another axis does in
    every batch, the others alike in all (a count that varies by batch, as NonMaxSuppression's, is no sample axis)."""
    first = shapes[0]
    if not first or first[0] == sizes[0]:
        return 0
    for axis in range(1, len(first)):
        if all(len(shape) == len(first) and shape[axis] == size and all(
                shape[other] == first[other] for other in range(len(first)) if other != axis)
               for shape, size in zip(shapes, sizes)):
            return axis
    return 0


def joined(outputs: Sequence[Mapping[str, np.ndarray]], batches: Sequence[Batch]) -> dict[str, np.ndarray]:
    """Each output of ``outputs`` (one mapping per batch of ``batches``, in their order) joined along its
    :func:`sample_axis`, that axis first; a scalar output is one value per batch."""
    sizes = [sample_count(batch) for batch in batches]
    found = {}
    for name in outputs[0]:
        parts = [np.asarray(out[name]) for out in outputs]
        if parts[0].ndim == 0:
            found[name] = np.stack(parts)
            continue
        axis = sample_axis([part.shape for part in parts], sizes)
        found[name] = np.concatenate(parts, axis=axis) if axis == 0 else \
            np.ascontiguousarray(np.moveaxis(np.concatenate(parts, axis=axis), axis, 0))
    return found
