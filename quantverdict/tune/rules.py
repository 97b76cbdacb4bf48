"""The rules a recipe search decides by: a candidate's score, the SNR of its held-out samples pooled (the verdict's own
``snr_db``, so a lock's score and the case's verdict say the same thing), whether it is better than the best before it
(the case's bounds first, then a gain paired by sample that stands out of the spread between samples), and when it
falls out of reach of that one (racing). Kept apart from the search's loop, which applies them.

The gain is each sample's, the ratio of the two graphs' error energies on it, averaged: every sample weighs the same,
as in top-1 agreement, where the pooled SNR's gain is decided by the few samples whose error is largest. Judged
pooled, PaddleOCR's text recogniser left GPTQ out (+0.6 dB on 64 held-out calibration samples, within its spread)
where the per-sample test took it (+4.2 dB), and the choice so made measured 2.2 dB less on the evaluation set (its
text-direction classifier 3.2 dB less). The mean of the samples' SNRs is no score, though: a saturated softmax's
samples reproduced to 1e-24 put that classifier at 105-115 dB, its verdict at 31 dB. The signal cancels in the ratio
(an FP32 output of exactly 0, a text detector's map of a page without text, counts by its error like any other
sample), and a sample reproduced exactly counts as the best sample reproduced inexactly, not at ±1000 dB."""
from __future__ import annotations

import math

import numpy as np

from quantverdict.judge import layer_errors
from quantverdict.judge.layer_errors import error_energy, per_sample

MIN_GAIN_DB = 0.1  # the mean gain per sample that makes a more elaborate candidate worth taking …
GAIN_SE = 2.0  # … where it also exceeds this many standard errors of the gains paired by sample
REACH_SE = 4.0  # a candidate stops after a fold where its mean gain so far, plus this many standard errors, is short
MAX_DB = 1e3  # the score of a graph that reproduces every held-out sample exactly (the worst: a non-finite output)


def sample_noise(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Each held-out sample's error energy against FP32 (first axis the samples; infinite where it is not finite):
    what every rule below reads, the samples paired by position."""
    r = per_sample(reference)
    return error_energy(r, per_sample(candidate).reshape(r.shape))


def pooled_snr_db(reference: np.ndarray, noise: np.ndarray) -> float:
    """The SNR of the first ``len(noise)`` samples of ``reference`` pooled, as the verdict's ``snr_db`` computes it on
    the same outputs (:func:`quantverdict.judge.layer_errors.pooled_snr_db`), within ±:data:`MAX_DB`."""
    return float(np.clip(layer_errors.pooled_snr_db(reference[:len(noise)], noise), -MAX_DB, MAX_DB))


def paired_gains(noise: np.ndarray, than: np.ndarray) -> np.ndarray:
    """Each sample's gain in SNR (dB) of a graph whose samples' error energies are ``noise`` over one whose are
    ``than`` (the first ``len(noise)`` samples): the ratio of the two errors, an exact sample's error taken as the
    least inexact one's of either graph. A sample not finite in one graph alone is that graph's loss of
    :data:`MAX_DB`; exact or not finite in both, a tie."""
    than = than[:len(noise)]
    bad, worse = ~np.isfinite(noise), ~np.isfinite(than)
    both = ~bad & ~worse
    inexact = np.concatenate([noise[both], than[both]])
    floor = float(inexact[inexact > 0].min()) if (inexact > 0).any() else 0.0
    a, b = np.maximum(than[both], floor), np.maximum(noise[both], floor)
    gains = np.zeros(len(noise))
    with np.errstate(divide="ignore", invalid="ignore"):
        gains[both] = np.where(a == b, 0.0, 10 * np.log10(a / b))
    gains[bad & ~worse], gains[worse & ~bad] = -MAX_DB, MAX_DB
    return np.clip(gains, -MAX_DB, MAX_DB)


def better(samples: np.ndarray, than: np.ndarray | None, meets: bool | None = None,
           than_meets: bool | None = None) -> bool:
    """The case's bounds first: a candidate that meets them on the held-out samples (``meets``) where the one it is
    compared with does not (``than_meets``) is better, and one that misses them where that one met them is not,
    whatever their SNR (a higher SNR may hide a worse worst sample that a bound names). Otherwise a mean gain per
    sample (:func:`paired_gains` of the samples' error energies, ``samples`` over ``than``) of more than
    :data:`MIN_GAIN_DB` and more than :data:`GAIN_SE` standard errors of the paired gains (the same samples judged
    twice): a candidate that only matches the simpler one before it, within what another draw of samples would move,
    is not taken."""
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
    gain = paired_gains(samples, than)
    spread = standard_errors(gain, GAIN_SE) if gain.size > 1 else 0.0
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
    gain = paired_gains(samples, rival)
    if gain.size < 2:
        return False
    return float(gain.mean()) + standard_errors(gain, REACH_SE) < MIN_GAIN_DB


def standard_errors(gain: np.ndarray, count: float) -> float:
    """``count`` standard errors of the mean of the paired gains ``gain`` (two or more samples): the spread another
    draw of samples would move their mean by, which a gain must clear (:func:`weighed`) or a loser cannot
    (:func:`out_of_reach`)."""
    return count * float(np.std(gain, ddof=1)) / math.sqrt(gain.size)
