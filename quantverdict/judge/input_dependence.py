"""Whether a reference judges anything: outputs that do not depend on the input make every precision agree with them.

A seeded ShuffleNet exported by torch's dynamo exporter gave the same logits for every input (their sample-to-sample
part 1e-5 of their size): FP16, INT8 and FP8 all passed at cosine 1.00000, INT8 at 116 dB and FP16 at 75 dB, the
verdicts judging a constant. Where every output varies from sample to sample by less than FP16 resolves, the case says
so: a note kept with its comparison and warned, its bounds judged as ever (a detector's anchors, constant by design,
are one output of several).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from quantverdict.judge.layer_errors import per_sample

FP16_RESOLUTION = 2.0 ** -11  # FP16's unit roundoff: a part smaller than this, relative to the output, it cannot hold


def constant_outputs(reference: Mapping[str, np.ndarray]) -> str | None:
    """A note where every output of ``reference`` (samples first, two or more) varies from sample to sample by less
    than :data:`FP16_RESOLUTION` of its size (in energy: the squares); else None."""
    ratios: dict[str, float] = {}
    samples = 0
    for name, values in reference.items():
        rows = per_sample(values)
        samples = len(rows)
        mean = rows.mean(0)
        total = float(np.einsum("ij,ij->", rows, rows))  # no temporary the size of the outputs: a search judges
        varying = max(total - len(rows) * float(mean @ mean), 0.0)  # many candidates against one reference
        if len(rows) < 2 or varying > FP16_RESOLUTION ** 2 * total:
            return None
        ratios[name] = varying / total if total else 0.0
    if not ratios:
        return None
    worst = max(ratios.values())
    size = f"{10 * math.log10(worst):.0f} dB of their energy" if worst else "nothing"
    return (f"the FP32 outputs ({', '.join(ratios)}) barely depend on the inputs: across the {samples} samples their "
            f"sample-to-sample part is {size}, less than FP16 resolves, so every precision agrees with them whatever it "
            "does to the input's part (weights left at their initialisation, or inputs outside what the model reads?)")
