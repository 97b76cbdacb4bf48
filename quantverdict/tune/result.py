"""What a recipe search found: each candidate judged (settings, held-out score, verdict, time) and the choice, with the
trade-off between layers kept in a wider format (FP16 or FP32) and accuracy. Each shape is declared once, here: the
search fills these values, the cache and the run record keep them as :meth:`SearchResult.to_dict` writes them, the
lock file keeps a candidate's reviewed part (:data:`LOCKED_OUT` left out), the page reads the trade-off."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Iterator, Mapping

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, computed_field

from quantverdict.errors import HarnessError
from quantverdict.precision.settings import RecipeSettings, formats_words
from quantverdict.resources import cpu_seconds, peak_within, worker_peaks
from quantverdict.tune.fallback import layers_kept


def _settings(value: object) -> RecipeSettings:
    """Settings as the search made them, or as a document writes them (a mapping), checked."""
    if not isinstance(value, (Mapping, RecipeSettings)):
        raise ValueError(f"expected recipe settings by name, not {value!r}")
    try:
        return RecipeSettings.parse(value, "searched")
    except HarnessError as exc:  # a field's error: the document's reader names where it is
        raise ValueError(str(exc).splitlines()[0]) from None


Settings = Annotated[RecipeSettings, PlainValidator(_settings), PlainSerializer(lambda settings: settings.to_dict())]
LOCKED_OUT = {"seconds", "taken"}  # a candidate's fields a lock file leaves out: this run's time, and what ``why`` says


class Cost(BaseModel):
    """What a stage took: wall seconds, CPU-seconds (this process's and the worker processes' it waited for) and the
    peak memory (MB) of this process while it ran (:func:`~quantverdict.resources.peak_within`) and of the largest
    worker the stage started."""

    model_config = ConfigDict(frozen=True)

    wall_s: float
    cpu_s: float
    peak_mb: float
    worker_peak_mb: float = 0.0  # none started (and a record written before workers' peaks were kept)

    def words(self) -> str:
        workers = f", workers {self.worker_peak_mb / 1024:.1f} GB" if self.worker_peak_mb else ""
        return f"{self.wall_s:.0f} s, {self.cpu_s:.0f} CPU-s, peak memory {self.peak_mb / 1024:.1f} GB{workers}"


@contextmanager
def costed() -> Iterator[Callable[[], Cost]]:
    """The block's cost so far, asked of the function it gives."""
    begun, cpu, workers = time.perf_counter(), cpu_seconds(), len(worker_peaks())
    with peak_within() as peak:
        def cost() -> Cost:
            return Cost(wall_s=round(time.perf_counter() - begun, 3), cpu_s=round(cpu_seconds() - cpu, 3),
                        peak_mb=round(peak(), 1), worker_peak_mb=round(max(worker_peaks()[workers:], default=0.0), 1))

        yield cost


class Candidate(BaseModel):
    """One candidate of a search: its settings, judged on the held-out samples."""

    model_config = ConfigDict(extra="forbid", strict=True)

    settings: Settings
    score_db: float | None = None  # output SNR of the held-out samples pooled, the verdict's snr_db; higher is better
    passed: bool | None = None  # within the precision's tolerance on the held-out samples
    seconds: float = 0.0
    error: str | None = None  # a technique this graph refuses (its message), not a failed search
    folds: int | None = None  # judged on this many folds only: stopped there, out of reach of the best (else all)
    taken: bool | None = None  # the search took it over the best before it (None: not decided, or stopped short)
    why: str | None = None  # whether the search took it over the best before it, and by which rule and numbers


class TradeoffPoint(BaseModel):
    """The best candidate a search judged with one count of layers kept wider (:meth:`SearchResult.tradeoff`)."""

    model_config = ConfigDict(extra="allow", strict=True)  # a record: machine-written, read by later versions

    share: float
    layers_in_float: int
    format: str | None = None  # the formats the layers kept wider were offered (fp16/fp32), None where none
    score_db: float
    passed: bool | None = None
    settings: Settings = RecipeSettings()
    chosen: bool = False


@dataclass(frozen=True)
class Incumbent:
    """A lock's recipe, judged beside a search (a nightly check): its settings and the layers it keeps wider, as the
    lock holds them, and the alternatives nearest to it when it was locked (the best of the others its search judged),
    which a check judges first."""

    settings: RecipeSettings
    nearest: tuple[RecipeSettings, ...] = ()
    kept: tuple[tuple[str, str], ...] | None = None  # the layers its fallback keeps wider, with their formats
    met_bounds: bool | None = None  # whether it met the case's bounds on held-out samples when it was locked

    def key(self) -> list[object]:
        return [[settings.to_dict() for settings in (self.settings, *self.nearest)], self.kept, self.met_bounds]


class SearchResult(BaseModel):
    """A search's candidates and its choice."""

    model_config = ConfigDict(extra="ignore")  # what it writes beside its fields (complete, tradeoff) is derived

    chosen: Settings
    candidates: list[Candidate] = []
    held_out_samples: int = 0  # every calibration sample, each judged by recipes calibrated without it
    folds: int = 0
    not_tried: list[Settings] = []  # left when the wall-time stop came
    note: str = ""
    incumbent: Candidate | None = None  # settings judged beside the candidates (a lock's), on the same samples
    beats_incumbent: bool | None = None  # the choice is :func:`better` than the incumbent's on the paired samples
    beyond: list[Candidate] = []  # the choice with more layers kept wider than max_fallback
    layers: int = 0  # the weighted layers a share of them keeps wider is counted of
    cost: Cost | None = None  # what the search took (not what reading it from the cache took)
    passed_if: list[str] = []  # the case's bounds, which a candidate that ``passed`` met (as the lock names them)
    # the layers the choice was judged with, where fixed: a check's (the lock's), or a calibrator's judged at the
    # fallback stage's ranking
    kept: tuple[tuple[str, str], ...] | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def complete(self) -> bool:
        """Every candidate was tried: the choice any runner makes."""
        return not self.not_tried

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tradeoff(self) -> list[TradeoffPoint]:
        """What the search found for each count of the layers kept wider: the best candidate it judged with that
        many (none: 0), their share and format, its held-out SNR and whether it met the case's bounds, by count; no
        candidate is judged for this, so the other settings may differ between points (each point names them)."""
        best: dict[int, tuple[float, Candidate]] = {}
        for candidate in [*self.candidates, *self.beyond]:
            count = layers_kept(candidate.settings.fallback or None, self.layers)
            score = candidate.score_db
            if score is not None and candidate.folds is None and (count not in best or score > best[count][0]):
                best[count] = score, candidate
        return [TradeoffPoint(share=round(count / max(self.layers, 1), 4), layers_in_float=count,
                              format=formats_words(candidate.settings.fallback_formats()) if count else None,
                              score_db=score, passed=candidate.passed, settings=candidate.settings,
                              chosen=candidate.settings == self.chosen)
                for count, (score, candidate) in sorted(best.items())]

    def to_dict(self) -> dict[str, Any]:
        """As the cache and the run record keep it."""
        return self.model_dump()
