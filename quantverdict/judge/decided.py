"""Which evaluation samples FP32 itself decides, at the resolution their inputs were recorded with.

Top-1 agreement counts a quantized model's changed decisions; on a sample whose two best classes
FP32 scores almost alike, any rounding anywhere changes it, and so does moving the input by less
than the step its data carries (a photograph's pixels are 8-bit: 1/255 of their range). Such a flip
is not a regression: the input does not determine the decision. On trained networks and natural
images these near-ties are what bounds agreement (BF16, whose rounding is near-lossless, flipped 13
and 16 of 512 EfficientNet-Lite0 and -Lite1 decisions, 7 of each on such samples). Where a model's
input declares its ``resolution`` (the step of its data, in the units the model reads), FP32 is run
on ``DITHERS`` copies of the evaluation inputs, each value moved uniformly within half a step; a
sample whose FP32 decision changes on any copy is undecided, and top-1 agreement is judged on the
others (:func:`quantverdict.judge.compare.compare`; the count left out and the agreement over every
sample are kept beside it). Random, not worst-case, movement: a worst-case one of 1/255 (an
adversarial example) changes most ImageNet decisions and would leave nothing to judge.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from quantverdict.models.spec import Batch, InputSpec

DITHERS, SEED = 4, 0


def dithered(batches: Sequence[Batch], inputs: Sequence[InputSpec], seed: int) -> list[Batch]:
    """``batches`` with each float input that declares a resolution moved uniformly within half its step."""
    rng = np.random.default_rng(seed)
    steps = {spec.name: spec.resolution for spec in inputs if spec.resolution is not None}
    out = []
    for batch in batches:
        moved = dict(batch)
        for name, step in steps.items():
            values = batch[name]
            moved[name] = (values + rng.uniform(-step / 2, step / 2, values.shape)).astype(values.dtype)
        out.append(moved)
    return out


def undecided(reference: np.ndarray, infer: Callable[[Sequence[Batch]], np.ndarray], batches: Sequence[Batch],
              inputs: Sequence[InputSpec]) -> np.ndarray:
    """Samples (rows of ``reference``, FP32's scores on ``batches``) whose arg-max changes on one of
    ``DITHERS`` dithered copies of the batches, scored by ``infer``."""
    decision = reference.argmax(-1)
    changed = np.zeros(decision.shape, bool)
    for copy in range(DITHERS):
        changed |= infer(dithered(batches, inputs, SEED + copy)).argmax(-1) != decision
    return changed
