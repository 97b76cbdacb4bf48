"""Runtime fidelity: a runtime's outputs against the precision graph's semantics, under a bound
derived from the graph's own quantization noise, not from a hand-set cosine.

The semantics round every quantized tensor to a grid of step ``s``; the rounding error is close to
uniform, variance s²/12. A runtime that executes the same graph faithfully (integer kernels with
INT32 accumulation, float kernels summing in another order) can differ from it only where a value
lies so near a rounding boundary that it lands on the neighbouring level: a difference of exactly
one step. If a fraction ``p`` of the rounding decisions go the other way, the runtime deviates by
variance p·s² at each quantized tensor: 12·p times the quantization noise there. Both reach the
outputs through the same network, so to first order

    ‖runtime − semantics‖² ≈ 12 · p · ‖semantics − FP32‖²,

and ``p = ‖runtime − semantics‖² / (12 ‖semantics − FP32‖²)`` is the runtime's *equivalent flip
fraction*. The bound is the largest flip fraction a faithful runtime may show
(``max_flip_fraction``; 1/12 means the runtime adds at most as much error as the recipe's own
rounding). A deviation within float32 accumulation noise (``FLOAT_FLOOR`` of the output's RMS)
passes whatever the recipe's noise, so a nearly lossless graph is not held to zero.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from quantverdict.judge.compare import cosine

DEFAULT_MAX_FLIP_FRACTION = 1.0 / 12.0
FLOAT_FLOOR = 1e-5  # relative RMS: float32 sums over thousands of terms, in another order


@dataclass(frozen=True)
class OutputFidelity:
    output: str
    deviation_rms: float  # RMS of runtime − semantics
    recipe_noise_rms: float  # RMS of semantics − FP32 reference
    signal_rms: float  # RMS of the semantics
    flip_fraction: float  # equivalent fraction of rounding decisions flipped
    bound: float
    cosine: float  # runtime vs semantics, float64

    @property
    def passed(self) -> bool:
        if not np.isfinite(self.deviation_rms):
            return False
        if self.deviation_rms <= FLOAT_FLOOR * self.signal_rms:
            return True
        return self.flip_fraction <= self.bound

    def describe(self) -> str:
        relation = "≤" if self.passed else ">"
        return (f"{self.output}: deviation from the graph {self.deviation_rms:.4g} RMS against the recipe's own "
                f"rounding noise {self.recipe_noise_rms:.4g} RMS: equivalent to {100 * self.flip_fraction:.3g}% of "
                f"rounding decisions flipped ({relation} {100 * self.bound:.3g}%), cosine {self.cosine:.6f}")


@dataclass
class Fidelity:
    """One runtime against the semantics, every output; truthy when faithful."""

    runtime: str
    device: str
    outputs: list[OutputFidelity]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def __bool__(self) -> bool:
        return self.passed

    def explain(self) -> str:
        lines = [f"runtime diverges from the graph: {self.runtime} on {self.device}"]
        lines += [o.describe() for o in self.outputs if not o.passed]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "device": self.device, "passed": self.passed,
                "outputs": [{**asdict(o), "passed": o.passed} for o in self.outputs]}


def judge_fidelity(reference: dict[str, np.ndarray], semantics: dict[str, np.ndarray],
                   runtime_outputs: dict[str, np.ndarray], runtime: str, device: str,
                   max_flip_fraction: float | None = None, labels: frozenset[str] = frozenset()) -> Fidelity:
    """Each output of ``runtime_outputs`` against ``semantics``, scaled by semantics − ``reference``; the ``labels``
    (integers or booleans) only where every output is one: an id the runtime flips where the recipe flipped none is
    an infinite flip fraction, and each id is held to FP32's by its agreement all the same."""
    bound = DEFAULT_MAX_FLIP_FRACTION if max_flip_fraction is None else max_flip_fraction
    outputs = []
    judged = {name: sem for name, sem in semantics.items() if name not in labels} or semantics
    for name, sem in judged.items():
        sem64 = sem.astype(np.float64)
        got = np.asarray(runtime_outputs[name], np.float64)
        deviation = _rms(got - sem64)
        noise = _rms(sem64 - reference[name].astype(np.float64))
        flips = deviation ** 2 / (12 * noise ** 2) if noise > 0 else (0.0 if deviation == 0 else float("inf"))
        outputs.append(OutputFidelity(name, deviation, noise, _rms(sem64), float(flips), bound, cosine(sem64, got)))
    return Fidelity(runtime, device, outputs)


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values)))) if values.size else 0.0
