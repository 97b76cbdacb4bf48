"""A probability map judged by the decisions taken from it: the region above the application's threshold, and where
its peak is.

Cosine alone passes a broken map: a saliency network at cosine .995 moved the region an application cuts at 0.8 in
a fifth of its images (IoU .84, worst image .11). So, per sample, the region ``{p > threshold}`` of the candidate is
compared with FP32's by IoU, and its peak position with FP32's, on the elements FP32 *decides*: those further from
the threshold (or from FP32's own peak) than the noise the case's cosine bound already allows, ``σ = √(2(1 − c))``
times the sample's RMS (for small noise, ``1 − cos ≈ ½ (σ / rms)²``). A decision inside that band may move without
any bound being broken; one outside it moved because the candidate left the bounds it is judged by.
"""
from __future__ import annotations

import math

import numpy as np

DEFAULT_THRESHOLD = 0.5  # where a manifest names none: the midpoint of a probability


def allowed_noise(min_cosine: float | None) -> float:
    """The RMS error, relative to the reference's RMS, that a cosine bound allows (0 without one)."""
    return 0.0 if min_cosine is None else math.sqrt(max(0.0, 2.0 * (1.0 - min_cosine)))


def map_decisions(reference: np.ndarray, candidate: np.ndarray, threshold: float, min_cosine: float | None
                  ) -> dict[str, float | int]:
    """Per-sample region IoU at ``threshold`` over FP32's decided elements (mean; worst and which sample, for maps
    with spatial extent), the samples counted (those with a decided region in either), and peak agreement: the
    fraction of samples whose candidate peak lies where FP32 is within the allowed noise of its own peak."""
    ref = np.asarray(reference, np.float64).reshape(len(reference), -1)
    out = np.asarray(candidate, np.float64).reshape(len(candidate), -1)
    band = allowed_noise(min_cosine) * np.sqrt(np.mean(ref ** 2, axis=1, keepdims=True))
    decided = np.abs(ref - threshold) > band
    mine, theirs = (out > threshold) & decided, (ref > threshold) & decided
    union = np.count_nonzero(mine | theirs, axis=1)
    counted = union > 0
    iou = np.count_nonzero(mine & theirs, axis=1)[counted] / union[counted]
    peak = ref[np.arange(len(ref)), out.argmax(axis=1)] >= ref.max(axis=1) - band[:, 0]
    found: dict[str, float | int] = {"region_threshold": threshold, "region_samples": int(counted.sum()),
                                     "peak_agreement": float(peak.mean())}
    if iou.size:
        found["region_iou"] = float(iou.mean())
        if np.ndim(reference) >= 3:  # a map per sample: its worst image is a result of its own
            found["region_iou_worst"] = float(iou.min())
            found["region_iou_worst_sample"] = int(np.flatnonzero(counted)[iou.argmin()])
    return found
