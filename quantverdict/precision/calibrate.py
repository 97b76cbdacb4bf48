"""Activation-range calibration over a calibration set, cached by content hash.

Ranges are collected in one pass over the calibration batches by exposing the wanted tensors
as extra graph outputs of the FP32 model under ONNX Runtime (optimisations off, so every
tensor exists as named; a pass per part of them where their values would not fit the memory:
:mod:`quantverdict.precision.exposing`); each tensor's |x| goes into a streaming :class:`Histogram`,
so no activations are kept. The cache entry is readable JSON: method, parameters, versions and
per-tensor amax. A corrupt entry is moved aside by the cache and recalibrated.

Ranges are rounded up to :data:`RANGE_BITS` significant bits (:func:`portable`): activations computed by another
CPU's kernels (AVX-512, AVX2 with FMA, SSE) differ in their last bits, and so would every scale of a recipe built
from them, so one lock file would give each runner a graph of its own. Rounded, they differ only where a range lies
within float32's noise of a step of the grid (about 1 in 10,000 tensors for a relative difference of 1e-7). A scale at
most 0.2% coarser costs nothing measurable: on 16 small-network INT8 recipes the output SNR moved by −0.06 dB on
average, against ±0.3 dB that any change of scale moves it by (which values round up or down).
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Callable, Iterator, Mapping, Sequence, TypeVar

import numpy as np
import onnx

from quantverdict.cache import Cache
from quantverdict.hashing import content_hash, source_fingerprint
from quantverdict.errors import CalibrationError
from quantverdict.models.spec import Batch
from quantverdict.precision.batch_sets import batches_hash, siblings, union
from quantverdict.precision.calibrators import BINS, Calibrator, Histogram, add_to
from quantverdict.precision.exposing import exposed
from quantverdict.precision.riders import Rider, ride, riders
from quantverdict.precision.tensor_keys import computed_by

RANGE_BITS = 10  # relative step 0.1–0.2%
HISTOGRAM_SETS = 16  # channel ranges kept in this process (a fold's and the whole set's, for a few graphs)
HISTOGRAMS_KEPT = 6400  # tensors' histograms kept in this process: 100 MB at 2048 bins (16 sets of 400 tensors)
T = TypeVar("T")
_HISTOGRAMS: dict[tuple[str, str], Histogram] = {}  # (what computes the tensor, its batches) → its histogram
_CHANNEL_RANGES: dict[str, dict[str, np.ndarray]] = {}  # a search's folds' beside the one asked for
FORWARD_PASSES: Counter = Counter()
"""Calibration forward passes run in this process, by model graph name (tests count them)."""


def calibrate(
    cache: Cache,
    model_bytes: bytes,
    tensors: Sequence[str],
    batches: Sequence[Batch],
    calibrator: Calibrator | None = None,
    shared: bool = False,
) -> dict[str, float]:
    """Per-tensor amax of ``tensors`` over ``batches``; a cache hit runs no forward pass. ``shared``: the graph is one
    every set of a search is calibrated on (the unprepared graph), so its first pass measures them all
    (:func:`~quantverdict.precision.batch_sets.siblings`)."""
    calibrator = calibrator or Calibrator()
    if not batches:
        raise CalibrationError("calibration set is empty")
    import onnxruntime

    graph, data = content_hash(model_bytes, list(tensors)), batches_hash(batches)
    key = content_hash("calibration", graph, data, calibrator.params,
                       source_fingerprint("quantverdict.precision.calibrate", "quantverdict.precision.calibrators"))

    def produce() -> bytes:
        histograms = _histograms(model_bytes, graph, list(tensors), batches, data, shared)
        ranges = {name: float(portable(calibrator.amax(hist))) for name, hist in histograms.items()}
        document = {**calibrator.params, "onnxruntime": onnxruntime.__version__, "batches": len(batches),
                    "ranges": ranges}
        return json.dumps(document, indent=1, sort_keys=True).encode()

    path = cache.get_or_create("calibration", key, ".json", produce, {**calibrator.params, "tensors": len(tensors)})
    return json.loads(path.read_text())["ranges"]


def _histograms(model_bytes: bytes, graph: str, tensors: list[str], batches: Sequence[Batch], data: str,
                shared: bool = False) -> dict[str, Histogram]:
    """Each of ``tensors``' histogram over ``batches``: kept from an earlier graph where a tensor computed the same way
    (:func:`~quantverdict.precision.tensor_keys.computed_by`) met the same batches, the others measured in one pass
    with the sets :func:`siblings` plans beside ``batches`` (``graph``: the hash of the graph and tensors, ``data``
    of the batches), and where the graph is ``shared``, the statistics planned to ride that pass
    (:mod:`quantverdict.precision.riders`), all kept, the oldest dropped beyond :data:`HISTOGRAMS_KEPT`. Histograms
    are kept for every calibrator (a search tries max, percentile and MSE on the same graph and folds, and each forward
    pass is a pass over the model: MiniLM's search, a fifth of its calibration time), and a graph prepared at a few
    layers (SmoothQuant on a CNN's classifier) measures only the tensors those layers change."""
    known = computed_by(onnx.load_from_string(model_bytes), graph)
    keys = {name: known.get(name) or content_hash(graph, name) for name in tensors}  # one it lacks: its run says so
    if any((keys[name], data) not in _HISTOGRAMS for name in tensors):
        asked, *beside = siblings(batches, graph, shared)
        others = [(found, batches_hash(found)) for found in beside]
        others = [(found, each) for found, each in others if any((keys[name], each) not in _HISTOGRAMS
                                                                 for name in tensors)]
        sets, held = [asked, *(found for found, _ in others)], [data, *(each for _, each in others)]
        needed = [name for name in tensors if any((keys[name], each) not in _HISTOGRAMS for each in held)]
        riding = riders(model_bytes, len(sets)) if shared else []
        for each, measured in zip(held, collect_histograms(model_bytes, needed, sets, riding=riding)):
            for name, histogram in measured.items():
                _HISTOGRAMS.pop((keys[name], each), None)
                _HISTOGRAMS[keys[name], each] = histogram
    found = {name: _HISTOGRAMS[keys[name], data] for name in tensors}
    while len(_HISTOGRAMS) > HISTOGRAMS_KEPT:  # the oldest first (what this call returns is held by ``found``)
        _HISTOGRAMS.pop(next(iter(_HISTOGRAMS)))
    return found


def _with_siblings(kept: dict[str, T], graph: str, batches: Sequence[Batch], data: str,
                   measure: Callable[[list[list[Batch]]], list[T]]) -> T:
    """A statistic of ``graph`` (the hash of what it is measured on) over ``batches`` (``data``: their hash), from
    ``kept`` or measured by ``measure`` (each of several sets' in one pass) with the sets :func:`siblings` plans beside
    it that ``kept`` lacks, all kept (the oldest dropped beyond :data:`HISTOGRAM_SETS`)."""
    asked_key = content_hash(graph, data)
    if asked_key not in kept:
        asked, *beside = siblings(batches, graph)
        others = [(content_hash(graph, batches_hash(found)), found) for found in beside]
        missing = [(asked_key, asked), *((key, found) for key, found in others if key not in kept)]
        for (key, _), value in zip(missing, measure([found for _, found in missing])):
            _keep(kept, key, value)
    return kept[asked_key]


def _keep(kept: dict[str, T], key: str, value: T) -> None:
    """``value`` kept under ``key``, the oldest dropped beyond :data:`HISTOGRAM_SETS`."""
    while len(kept) >= HISTOGRAM_SETS:
        kept.pop(next(iter(kept)))
    kept[key] = value


def portable(values: float | np.ndarray) -> np.ndarray:
    """``values`` (≥ 0) rounded up to :data:`RANGE_BITS` significant bits, as float64: the same on every CPU but
    where a value lies within its last bits of a step (see the module docstring); 0 and infinity stay."""
    mantissa, exponent = np.frexp(np.asarray(values, np.float64))
    with np.errstate(invalid="ignore"):
        rounded = np.ldexp(np.ceil(mantissa * 2.0 ** RANGE_BITS) / 2.0 ** RANGE_BITS, exponent)
    return np.where(np.isfinite(rounded), rounded, values)


def channel_ranges(cache: Cache, model_bytes: bytes, tensors: Sequence[str], axis: int,
                   batches: Sequence[Batch]) -> dict[str, np.ndarray]:
    """Per-channel amax along ``axis`` (over every other axis) of ``tensors`` over ``batches``, for
    rewrites that balance ranges channel by channel (SmoothQuant, equalization); cached like
    :func:`calibrate`."""
    if not batches:
        raise CalibrationError("calibration set is empty")
    data = batches_hash(batches)
    key = content_hash("channel-ranges", model_bytes, list(tensors), axis, data,
                       source_fingerprint("quantverdict.precision.calibrate"))

    def produce() -> bytes:
        amax = _with_siblings(_CHANNEL_RANGES, content_hash(model_bytes, list(tensors), axis), batches, data,
                              lambda sets: _channel_amax(model_bytes, tensors, axis, sets))
        return json.dumps({name: portable(v).tolist() for name, v in amax.items()}).encode()

    path = cache.get_or_create("channel-ranges", key, ".json", produce, {"tensors": len(tensors)})
    return {name: np.asarray(v, np.float64) for name, v in json.loads(path.read_text()).items()}


def _channel_amax(model_bytes: bytes, tensors: Sequence[str], axis: int,
                  sets: Sequence[Sequence[Batch]]) -> list[dict[str, np.ndarray]]:
    """Each set's per-channel amax of ``tensors`` along ``axis``, in one pass over the batches the sets hold."""
    order, holders = union(sets)
    found = ChannelAmax(model_bytes, tensors, axis, len(sets))
    for index, values in tensor_values(model_bytes, tensors, order):
        found.add(holders[index], values)
    return found.amax


class ChannelAmax:
    """Each of several sets' per-channel amax of a graph's ``tensors`` along ``axis``, a batch at a time; a
    :class:`~quantverdict.precision.riders.Rider` of the graph's calibration pass, which keeps them where
    :func:`channel_ranges` looks first."""

    def __init__(self, model_bytes: bytes, tensors: Sequence[str], axis: int, sets: int):
        self.graph, self.tensors, self.axis = content_hash(model_bytes, list(tensors), axis), list(tensors), axis
        self.amax: list[dict[str, np.ndarray]] = [{} for _ in range(sets)]

    def add(self, holding: Sequence[int], values: Mapping[str, np.ndarray]) -> None:
        for name in self.tensors:
            value = values.get(name)
            if value is None:
                continue  # in another part of the tensors
            others = tuple(at for at in range(value.ndim) if at != self.axis % value.ndim)  # max |x|, no temporary
            batch_amax = np.maximum(value.max(axis=others), -value.min(axis=others)) + 0.0  # -0.0 as |x| has it
            for number in holding:
                found = self.amax[number]
                found[name] = np.maximum(found[name], batch_amax) if name in found else batch_amax

    def keep(self, sets: Sequence[Sequence[Batch]]) -> None:
        for batches, amax in zip(sets, self.amax):
            _keep(_CHANNEL_RANGES, content_hash(self.graph, batches_hash(batches)), amax)


def collect_histograms(model_bytes: bytes, tensors: Sequence[str], sets: Sequence[Sequence[Batch]],
                       bins: int = BINS, riding: Sequence[Rider] = ()) -> list[dict[str, Histogram]]:
    """Each set's histograms of ``tensors``, in one forward pass per batch the sets hold: every requested tensor's
    |x| is binned into the histograms of the sets holding its batch, and then dropped; the riders ``riding`` measure
    their own statistics of the same sets from the same values, and keep them once every batch has passed."""
    order, holders = union(sets)
    histograms = [{name: Histogram(bins) for name in tensors} for _ in sets]
    wanted = set(tensors)
    exposing = list(dict.fromkeys([*tensors, *(name for rider in riding for name in rider.tensors)]))
    for index, values in tensor_values(model_bytes, exposing, order):
        ride(riding, holders[index], values)
        for name, value in values.items():
            if name in wanted:
                add_to([histograms[number][name] for number in holders[index]], value)
    for rider in riding:
        rider.keep(sets)
    return histograms


def tensor_values(model_bytes: bytes, tensors: Sequence[str], batches: Sequence[Batch]
                  ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """``tensors``' values from the graph under ONNX Runtime with optimisations off (so every tensor exists as named),
    as (the batch's index, a part of them), in parts that fit the memory (:func:`exposed`): what calibration, channel
    ranges and GPTQ's H are measured on."""
    from tqdm import tqdm

    model = onnx.load_from_string(model_bytes)
    for index, values in tqdm(exposed(model, tensors, batches), desc=f"calibrating {model.graph.name}", unit="pass",
                              leave=False, disable=None):
        FORWARD_PASSES[model.graph.name] += 1
        yield index, values


def held_values(model_bytes: bytes, tensors: Sequence[str], batches: Sequence[Batch]) -> list[dict[str, np.ndarray]]:
    """Each batch's values of ``tensors``, all held at once: for a few small ones (an If's conditions)."""
    found: list[dict[str, np.ndarray]] = [{} for _ in batches]
    for index, values in tensor_values(model_bytes, tensors, batches):
        found[index].update(values)
    return found
