"""What a recipe search found: each candidate judged (settings, held-out score, verdict, time) and the choice, as the
cache, the run record and the lock file keep them, with the trade-off between layers kept in a wider format (FP16 or
FP32) and accuracy."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from quantverdict.tune.fallback import layers_kept
from quantverdict.precision.wider_layers import formats_words


@dataclass
class Candidate:
    settings: dict[str, Any]
    score: float | None = None  # mean per-sample output SNR (dB) on the held-out samples; higher is better
    passed: bool | None = None  # within the precision's tolerance on the held-out samples
    seconds: float = 0.0
    error: str | None = None  # a technique this graph refuses (its message), not a failed search


@dataclass
class SearchResult:
    chosen: dict[str, Any]
    candidates: list[Candidate] = field(default_factory=list)
    held_out_samples: int = 0  # every calibration sample, each judged by recipes calibrated without it
    folds: int = 0
    not_tried: list[dict[str, Any]] = field(default_factory=list)  # left when the wall-time stop came
    note: str = ""
    incumbent: Candidate | None = None  # settings judged beside the candidates (a lock's), on the same samples
    beats_incumbent: bool | None = None  # the choice is :func:`better` than the incumbent's on the paired samples
    beyond: list[Candidate] = field(default_factory=list)  # the choice with more layers kept wider than max_fallback
    layers: int = 0  # the weighted layers a share of them keeps wider is counted of

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
            count = layers_kept(candidate.settings.get("fallback"), self.layers)
            if candidate.score is not None and (count not in best or candidate.score > best[count].score):
                best[count] = candidate
        return [{"share": round(count / max(self.layers, 1), 4), "layers_in_float": count,
                 "format": formats_words(candidate.settings.get("fallback_format", "fp32")) if count else None,
                 "score_db": candidate.score,
                 "passed": candidate.passed, "settings": candidate.settings,
                 "chosen": candidate.settings == self.chosen} for count, candidate in sorted(best.items())]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete, "tradeoff": self.tradeoff()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SearchResult":
        incumbent = data.get("incumbent")
        return cls(data["chosen"], [Candidate(**c) for c in data["candidates"]], data["held_out_samples"],
                   data["folds"], data["not_tried"], data["note"], None if incumbent is None else Candidate(**incumbent),
                   data.get("beats_incumbent"), [Candidate(**c) for c in data.get("beyond", [])],
                   data.get("layers", 0))
