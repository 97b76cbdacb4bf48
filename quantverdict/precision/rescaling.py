"""Which activations a recipe's preparation rescaled, channel by channel, and from what.

Equalization and SmoothQuant keep the FP32 function by dividing an activation's channels by ``s`` and multiplying its
consumers' weights by ``s``. The prepared graph's layer inputs are then the unprepared graph's, each channel times a
constant, and so are their second moments: GPTQ's H of a rescaled input is ``D H D`` (:mod:`quantverdict.precision.
hessian`). A search prepares the graph once per fold, from that fold's ranges: H measured on each prepared graph cost
a pass over the calibration batches per fold and candidate; derived, one measurement of the unprepared graph serves
them all (the same sums up to float64 rounding: the prepared graph's own float32 activations differ from the exact
product by as much).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx


@dataclass(frozen=True)
class Rescale:
    """A prepared graph's tensor as ``source`` (a tensor of the graph before preparation) times ``factor`` per
    channel (the channel axis of its consumers' inputs: a Conv's axis 1, a MatMul's last)."""

    source: str
    factor: np.ndarray


@dataclass
class Rescaling:
    """The graph ``before`` a preparation and each tensor it rescaled (by the prepared graph's name)."""

    before: onnx.ModelProto
    tensors: dict[str, Rescale] = field(default_factory=dict)

    def record(self, tensor: str, prepared_as: str, factor: np.ndarray) -> None:
        """``prepared_as`` is ``tensor`` (a tensor of the graph as prepared so far) times ``factor``: composed with
        what ``tensor`` already is (a SmoothQuant scale after an equalization)."""
        found = self.tensors.get(tensor, Rescale(tensor, np.ones(len(factor))))
        self.tensors[prepared_as] = Rescale(found.source, found.factor * np.asarray(factor, np.float64))


@dataclass(frozen=True)
class Prepared:
    """The FP32 graph as a recipe prepares it, and where its preparation rescaled activations, how (None: none)."""

    graph: onnx.ModelProto
    rescaling: Rescaling | None = None
