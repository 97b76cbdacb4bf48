"""The data a model is built, calibrated and judged on: its torch module, its calibration batches, its
evaluation batches and labels, and the content key of a set of batches.

A user's callables are called here (through :meth:`ModelSpec.call`, which names them when they fail) and
what they return is checked against the declared inputs. Synthetic batches are seeded, so a built-in's
data is the same in every process.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Protocol

import numpy as np

from quantverdict.errors import CalibrationError, UserCodeError
from quantverdict.hashing import content_hash
from quantverdict.models.spec import Batch, ModelSpec

Data = Literal["evaluation", "calibration"]
EVAL_BATCHES = 4  # synthetic evaluation batches, at least; more where the bounds need more samples
CALIBRATION_BATCHES = 4
EVAL_SEED, CALIBRATION_SEED = 1, 2


def build_module(spec: ModelSpec) -> Any:
    """The torch module, built under the spec's seed so that a factory drawing random weights draws the same."""
    import torch

    assert spec.build is not None
    torch.manual_seed(spec.seed)
    module = spec.call("build")
    if not isinstance(module, torch.nn.Module):
        raise UserCodeError(spec.describe("build"), TypeError(
            f"returned {type(module).__name__}; expected a torch.nn.Module"))
    return module.eval()


def calibration_batches(spec: ModelSpec) -> list[Batch]:
    """The calibration set: the spec's callable's batches (checked), or seeded synthetic ones where the spec
    chose ``synthetic``; a quantized case without one is refused (INT8 with made-up scales measures nothing)."""
    if spec.calibration is None:
        raise CalibrationError(
            f"model {spec.name!r} has no calibration set: give it one in the manifest "
            "(calibration: module:callable) or set calibration: synthetic to calibrate on generated inputs")
    if spec.calibration == "synthetic":
        return spec.sample_batches(CALIBRATION_BATCHES, CALIBRATION_SEED)
    return spec.check_batches(spec.call("calibration"), "calibration")


def evaluation(spec: ModelSpec, samples_needed: int) -> tuple[list[Batch], np.ndarray | None]:
    """The evaluation inputs and their labels (None where there are none): the spec's own, else seeded
    synthetic batches, enough of them for ``samples_needed`` samples (every top-1 bound resolvable)."""
    own = spec.evaluation()
    if own is not None:
        return own
    per_batch = next((item.shape[0] for item in spec.inputs if item.shape), 1)  # a scalar input has no batch axis
    return spec.sample_batches(max(EVAL_BATCHES, math.ceil(samples_needed / per_batch)), EVAL_SEED), None


def batches_key(batches: list[Batch]) -> str:
    """Content key of a list of batches (every input's name, dtype, shape and values)."""
    return content_hash([[(name, batch[name]) for name in sorted(batch)] for batch in batches])


class BatchSource(Protocol):
    """Where a run's calibration and evaluation batches come from: a model's own sets (:class:`OwnData`), or another
    split of them (a recipe search's held-out folds, :class:`quantverdict.tune.folds.HeldOut`). ``held_out``: its
    evaluation batches are held-out calibration samples, unlabelled, whose FP32 decisions are not screened at the
    inputs' resolution (every sample counted)."""

    held_out: bool

    def calibration(self, spec: ModelSpec) -> list[Batch]: ...

    def evaluation(self, spec: ModelSpec, samples_needed: int) -> tuple[list[Batch], np.ndarray | None]: ...


class OwnData:
    """A model's own calibration and evaluation sets."""

    held_out = False

    def calibration(self, spec: ModelSpec) -> list[Batch]:
        return calibration_batches(spec)

    def evaluation(self, spec: ModelSpec, samples_needed: int) -> tuple[list[Batch], np.ndarray | None]:
        return evaluation(spec, samples_needed)
