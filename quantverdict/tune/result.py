"""What a recipe search found: each candidate judged (settings, held-out score, verdict, time) and the choice, as the
cache, the run record and the lock file keep them, with the trade-off between layers kept in a wider format (FP16 or
FP32) and accuracy."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from quantverdict.precision.settings import RecipeSettings, formats_words
from quantverdict.resources import Cost
from quantverdict.tune.fallback import layers_kept


@dataclass
class Candidate:
    settings: RecipeSettings
    score: float | None = None  # output SNR (dB) of the held-out samples pooled, the verdict's snr_db; higher is better
    passed: bool | None = None  # within the precision's tolerance on the held-out samples
    seconds: float = 0.0
    error: str | None = None  # a technique this graph refuses (its message), not a failed search
    folds: int | None = None  # judged on this many folds only: stopped there, out of reach of the best (else all)
    taken: bool | None = None  # the search took it over the best before it (None: not decided, or stopped short)
    why: str | None = None  # whether the search took it over the best before it, and by which rule and numbers

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "settings": self.settings.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Candidate":
        return cls(**{**data, "settings": RecipeSettings.parse(data["settings"], "searched")})


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


@dataclass
class SearchResult:
    chosen: RecipeSettings
    candidates: list[Candidate] = field(default_factory=list)
    held_out_samples: int = 0  # every calibration sample, each judged by recipes calibrated without it
    folds: int = 0
    not_tried: list[RecipeSettings] = field(default_factory=list)  # left when the wall-time stop came
    note: str = ""
    incumbent: Candidate | None = None  # settings judged beside the candidates (a lock's), on the same samples
    beats_incumbent: bool | None = None  # the choice is :func:`better` than the incumbent's on the paired samples
    beyond: list[Candidate] = field(default_factory=list)  # the choice with more layers kept wider than max_fallback
    layers: int = 0  # the weighted layers a share of them keeps wider is counted of
    cost: Cost | None = None  # what the search took (not what reading it from the cache took)
    bounds: list[str] = field(default_factory=list)  # the case's, which a candidate that ``passed`` met
    # the layers the choice was judged with, where fixed: a check's (the lock's), or a calibrator's judged at the
    # fallback stage's ranking
    kept: tuple[tuple[str, str], ...] | None = None

    @property
    def complete(self) -> bool:
        """Every candidate was tried: the choice any runner makes."""
        return not self.not_tried

    def tradeoff(self) -> list[dict[str, Any]]:
        """What the search found for each count of the layers kept wider: the best candidate it judged with that
        many (none: 0), their share and format, its held-out SNR and whether it met the case's bounds, by count; no
        candidate is judged for this, so the other settings may differ between points (each point names them)."""
        best: dict[int, Candidate] = {}
        for candidate in [*self.candidates, *self.beyond]:
            count = layers_kept(candidate.settings.fallback or None, self.layers)
            if candidate.score is not None and candidate.folds is None and (count not in best or candidate.score > best[count].score):
                best[count] = candidate
        return [{"share": round(count / max(self.layers, 1), 4), "layers_in_float": count,
                 "format": formats_words(candidate.settings.fallback_formats()) if count else None,
                 "score_db": candidate.score,
                 "passed": candidate.passed, "settings": candidate.settings.to_dict(),
                 "chosen": candidate.settings == self.chosen} for count, candidate in sorted(best.items())]

    def to_dict(self) -> dict[str, Any]:
        """As the cache and the run record keep it."""
        return {"chosen": self.chosen.to_dict(), "candidates": [c.to_dict() for c in self.candidates],
                "held_out_samples": self.held_out_samples, "folds": self.folds,
                "not_tried": [settings.to_dict() for settings in self.not_tried], "note": self.note,
                "incumbent": None if self.incumbent is None else self.incumbent.to_dict(),
                "beats_incumbent": self.beats_incumbent, "beyond": [c.to_dict() for c in self.beyond],
                "layers": self.layers, "complete": self.complete, "tradeoff": self.tradeoff(),
                "cost": None if self.cost is None else self.cost.to_dict(), "bounds": self.bounds,
                "kept": None if self.kept is None else [list(pair) for pair in self.kept]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SearchResult":
        incumbent = data.get("incumbent")
        return cls(RecipeSettings.parse(data["chosen"], "searched"),
                   [Candidate.from_dict(c) for c in data["candidates"]], data["held_out_samples"], data["folds"],
                   [RecipeSettings.parse(settings, "searched") for settings in data["not_tried"]], data["note"],
                   None if incumbent is None else Candidate.from_dict(incumbent), data.get("beats_incumbent"),
                   [Candidate.from_dict(c) for c in data.get("beyond", [])], data.get("layers", 0),
                   Cost(**data["cost"]) if data.get("cost") else None, data.get("bounds", []),
                   None if data.get("kept") is None else tuple((layer, kind) for layer, kind in data["kept"]))
