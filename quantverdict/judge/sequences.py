"""A sequence output judged by what it decodes to: a CTC recogniser's per-position distributions read greedily, as
its application reads them (the best symbol at each position, repeats collapsed, blanks dropped).

Per-position top-1 counts a flip inside a run of one symbol, or between two blanks, as an error though the decoded
text is the same, and weighs every position alike where a reader sees words. So each sample's decoded sequence is
compared with FP32's: the share of samples decoded identically, and the symbol error rate (edit distance over FP32's
length, as a recogniser's CER is counted), with the worst sample named.
"""
from __future__ import annotations

import numpy as np

from quantverdict.models.spec import SequenceFormat


def decode(probabilities: np.ndarray, blank: int) -> list[int]:
    """Greedy CTC decoding of one sample's ``[positions, symbols]``: the best symbol at each position, repeats
    collapsed, ``blank`` dropped."""
    best = np.asarray(probabilities).argmax(axis=-1)
    kept = best[np.r_[True, best[1:] != best[:-1]]]
    return [int(symbol) for symbol in kept if symbol != blank]


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance between two symbol sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


def sequence_metrics(reference: np.ndarray, candidate: np.ndarray, layout: SequenceFormat) -> dict[str, float | int]:
    """The share of samples decoded as FP32 decodes them, the symbol error rate over FP32's symbols, and the worst
    sample (most edits) with its edits; the outputs ``[samples, positions, symbols]``, as batches' outputs are joined
    (:func:`~quantverdict.backends.samples.joined`: a ``[positions, batch, symbols]`` output too)."""
    decoded = [(decode(r, layout.blank), decode(o, layout.blank)) for r, o in zip(reference, candidate)]
    edits = np.asarray([edit_distance(r, o) for r, o in decoded])
    symbols = sum(len(r) for r, _ in decoded)
    return {"sequence_agreement": float(np.mean(edits == 0)), "sequence_samples": len(decoded),
            "symbol_error_rate": float(edits.sum() / symbols) if symbols else float(edits.sum() > 0),
            "sequence_worst_sample": int(edits.argmax()), "sequence_worst_edits": int(edits.max())}
