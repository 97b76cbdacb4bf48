"""The rules a recipe search decides by: each held-out sample's SNR against FP32, whether a candidate is better than
the best before it (the case's bounds first, then a paired gain that stands out of the spread between samples), and
when a candidate falls out of reach of it (racing). Kept apart from the search's loop, which applies them."""
from __future__ import annotations

import math

import numpy as np

from quantverdict.tune.fallback import error_energy, per_sample

MIN_GAIN_DB = 0.1  # the mean per-sample SNR gain that makes a more elaborate candidate worth taking …
GAIN_SE = 2.0  # … where it also exceeds this many standard errors of the paired per-sample gains
REACH_SE = 4.0  # a candidate stops after a fold where its mean gain so far, plus this many standard errors, is short
MAX_DB = 1e3  # a sample the candidate reproduces exactly
SIGNAL_FLOOR = 1e-2  # a sample holding less than this share of the mean sample's energy is judged against that share


def signal_floor(reference: np.ndarray) -> float:
    """The least signal energy a sample is judged against: :data:`SIGNAL_FLOOR` of the mean sample's."""
    return SIGNAL_FLOOR * float(np.mean(np.sum(per_sample(reference) ** 2, 1)))


def sample_snr_db(reference: np.ndarray, candidate: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Each sample's output SNR against FP32 (dB; first axis the samples): each held-out sample weighs the same,
    as in top-1 agreement, where one badly clipped sample would decide the SNR of the samples pooled. A sample's
    signal is at least ``floor`` (:func:`signal_floor` of every sample judged): a text detector's map of an image
    without text is exactly 0, and its SNR, -1000 dB for any error, decided a ranking. A non-finite output is the
    worst score, an exact one the best."""
    r = per_sample(reference)
    noise = error_energy(r, per_sample(candidate).reshape(r.shape))
    with np.errstate(divide="ignore", invalid="ignore"):
        db = 10 * np.log10(np.maximum(np.sum(r ** 2, 1), floor) / noise)
    return np.clip(np.where(noise == 0, MAX_DB, np.nan_to_num(db, nan=-MAX_DB)), -MAX_DB, MAX_DB)


def better(samples: np.ndarray, than: np.ndarray | None, meets: bool | None = None,
           than_meets: bool | None = None) -> bool:
    """The case's bounds first: a candidate that meets them on the held-out samples (``meets``) where the one it is
    compared with does not (``than_meets``) is better, and one that misses them where that one met them is not,
    whatever their SNR (a higher mean may hide a worse worst sample that a bound names). Otherwise a mean per-sample
    gain of more than :data:`MIN_GAIN_DB` and more than :data:`GAIN_SE` standard errors of the paired gains (the same
    samples judged twice): a candidate that only matches the simpler one before it, within what another draw of
    samples would move, is not taken."""
    return weighed(samples, than, meets, than_meets)[0]


def weighed(samples: np.ndarray, than: np.ndarray | None, meets: bool | None = None,
            than_meets: bool | None = None) -> tuple[bool, str]:
    """:func:`better`'s answer and its reason in words, for the lock and the progress: a choice at 32.76 dB over one
    at 33.33 dB reads as a mistake unless the rule and the numbers are beside it."""
    if than is None:
        return True, "taken: the first judged, the one the others must beat"
    if meets is not None and than_meets is not None and meets != than_meets:
        return meets, ("taken: it meets the case's bounds, the best before it does not" if meets else
                       "not taken: it misses the case's bounds, which the best before it meets")
    gain = samples - than
    spread = GAIN_SE * float(np.std(gain, ddof=1)) / math.sqrt(gain.size) if gain.size > 1 else 0.0
    need, mean = max(MIN_GAIN_DB, spread), float(gain.mean())
    rule = (f"more than {need:.2f} dB, the larger of {MIN_GAIN_DB:g} dB and {GAIN_SE:g} standard errors of the gains "
            "paired by sample")
    return (True, f"taken: {mean:+.2f} dB per sample over the best before it, {rule}") if mean > need else \
        (False, f"not taken: {mean:+.2f} dB per sample over the best before it, not {rule}")


def out_of_reach(samples: np.ndarray, rival: np.ndarray) -> bool:
    """Whether a candidate judged on the first ``len(samples)`` held-out samples so far trails ``rival`` (the one
    :func:`better` compares it with, judged on all of them) so that its mean paired gain, plus :data:`REACH_SE`
    standard errors, is still short of :data:`MIN_GAIN_DB`: the other folds would have to reverse what these show,
    each by more than the spread between samples (a one-sided t-test on 8 samples at p < 0.003), for it to be taken.
    Racing as irace and Hoeffding races do: a loser is not judged to the end, the winner always is."""
    gain = samples - rival[:len(samples)]
    if gain.size < 2:
        return False
    spread = REACH_SE * float(np.std(gain, ddof=1)) / math.sqrt(gain.size)
    return float(gain.mean()) + spread < MIN_GAIN_DB
