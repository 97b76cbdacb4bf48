"""What a graph's outputs cost against FP32's, sample by sample, in three sums per output: the error energy, the dot
product with FP32's output and the graph's own energy.

Each layer quantized alone (fallback's ranking, sensitivity) is kept as these, a few floats per sample, not as its
outputs: a text recogniser's 64 × 40 × 6,625 probabilities are 68 MB a layer, and one lock of it (51 layers, ranked
for three calibrations) wrote 16 GB of them to the cache. Fallback ranks by the error energies; sensitivity reads
cosine and SNR from the sums, as :func:`quantverdict.judge.compare.compare` computes them from the outputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from quantverdict.judge.detections import OnKept
from quantverdict.models.spec import DetectionFormat

View = Callable[[np.ndarray], np.ndarray]  # what of an output its errors are taken on (samples first, kept first)
SUMS = ("noise", "dot", "energy")  # each sample's: error energy, dot product with FP32's output, the graph's energy


@dataclass(frozen=True)
class Errors:
    """Per output name, each sample's sums (:data:`SUMS`) of a graph's outputs against FP32's."""

    sums: Mapping[str, Mapping[str, np.ndarray]]

    @classmethod
    def of(cls, reference: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
           views: Mapping[str, View] | None = None) -> "Errors":
        """The sums of ``outputs`` against ``reference`` (FP32's, on the same samples), for every output of both, each
        as its view reads it where ``views`` has one (a detector head's anchors FP32 keeps: what the verdict reads)."""
        sums, views = {}, views or {}
        for name in reference:
            view = views.get(name, whole)
            r = per_sample(view(reference[name]))
            c = per_sample(view(outputs[name])).reshape(r.shape)
            sums[name] = {"noise": error_energy(r, c), "dot": np.sum(r * c, 1), "energy": np.sum(c * c, 1)}
        return cls(sums)

    def arrays(self) -> dict[str, np.ndarray]:
        """As named arrays, for the cache (``<sum>/<output>``)."""
        return {f"{sum_name}/{name}": values[sum_name] for name, values in self.sums.items() for sum_name in SUMS}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "Errors":
        sums: dict[str, dict[str, np.ndarray]] = {}
        for key, values in arrays.items():
            sum_name, name = key.split("/", 1)
            sums.setdefault(name, {})[sum_name] = values
        return cls(sums)

    def noise(self, name: str) -> np.ndarray:
        """Each sample's error energy on output ``name`` (infinite where the graph's output is not finite)."""
        return np.asarray(self.sums[name]["noise"])

    def cosine(self, name: str, signal: float) -> float:
        """The cosine of output ``name`` with FP32's over every sample, whose energy is ``signal``
        (:func:`signal_energy`; 1 where both are all zero)."""
        energy, dot = float(np.sum(self.sums[name]["energy"])), float(np.sum(self.sums[name]["dot"]))
        if signal == 0 or energy == 0:
            return float(signal == energy and not np.any(self.noise(name)))
        return float(np.clip(dot / math.sqrt(signal * energy), -1.0, 1.0))

    def snr_db(self, name: str, signal: float) -> float:
        """The SNR of output ``name`` over every sample, against FP32's of energy ``signal`` (:func:`snr_of`)."""
        return snr_of(signal, self.noise(name))


def views_of(detections: Mapping[str, DetectionFormat], reference: Mapping[str, np.ndarray]) -> dict[str, View]:
    """What each of FP32's outputs ``reference`` has its errors taken on, where not the whole of it: a declared
    detector head's anchors FP32 keeps (:class:`~quantverdict.judge.detections.OnKept`, as the verdict reads it)."""
    return {name: OnKept.of(reference[name], layout) for name, layout in detections.items() if name in reference}


def whole(values: np.ndarray) -> np.ndarray:
    """An output's view where :func:`views_of` names none: all of it."""
    return values


def signal_energy(reference: np.ndarray) -> float:
    """The energy of FP32's outputs over every sample: what cosine and SNR measure against, once for every layer."""
    return float(np.sum(per_sample(reference) ** 2))


def pooled_snr_db(reference: np.ndarray, noise: np.ndarray) -> float:
    """The SNR of ``reference``'s samples pooled against their error energies ``noise`` (:func:`snr_of`)."""
    return snr_of(signal_energy(reference), noise)


def snr_of(signal: float, noise: np.ndarray) -> float:
    """The SNR of samples of energy ``signal`` pooled against their error energies ``noise``, as the verdict's
    ``snr_db``: infinite where every sample is exact, minus infinite where one is not finite or there is no signal."""
    total = float(np.sum(noise))
    if total == 0:
        return math.inf
    return 10 * math.log10(signal / total) if signal > 0 and math.isfinite(total) else -math.inf


def per_sample(values: np.ndarray) -> np.ndarray:
    """Outputs as float64 [samples, values] (the first axis the samples)."""
    values = np.asarray(values, np.float64)
    return values.reshape(len(values) if values.ndim else 1, -1)


def error_energy(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Each sample's summed squared error; a non-finite one is infinite (the most sensitive layer)."""
    error = candidate - reference
    return np.where(np.isfinite(error).all(1), np.sum(np.nan_to_num(error) ** 2, 1), np.inf)


def pooled_snr(signal: np.ndarray, noise: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """Each row of ``noise`` (a graph's per-sample error energy) as the SNR of the ``samples`` pooled (a ratio, not
    dB); 0 where the output is not finite."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.nan_to_num(signal[samples].sum() / noise[:, samples].sum(1), nan=0.0, posinf=math.inf)
