"""What a run is made of: cases (model × precision × backend), their enumeration, their results."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal

from quantverdict.precision import get_recipe, precision_rank

if TYPE_CHECKING:
    from quantverdict.report.schema import CaseRecord

Status = Literal["passed", "failed", "skipped", "error"]


@dataclass(frozen=True)
class Case:
    model: str
    precision: str
    backend: str

    @property
    def id(self) -> str:
        return f"{self.model}-{self.precision}-{self.backend}"


@dataclass
class CaseResult:
    """The outcome of one case, as data (serialised into the run record)."""

    case: Case
    status: Status
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    tolerance: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)
    trace: str = ""  # the traceback of an error: the user's code that failed, or a backend's crash
    cost: dict[str, float] = field(default_factory=dict)  # what it took (:class:`~quantverdict.tune.result.Cost`)

    def __bool__(self) -> bool:
        return self.status == "passed"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CaseResult":
        """The result a record's case holds (the inverse of :meth:`to_dict`)."""
        return cls(Case(data["model"], data["precision"], data["backend"]), data["status"], data.get("message", ""),
                   data.get("metrics", {}), data.get("tolerance", {}), data.get("timings", {}), data.get("cache", {}),
                   data.get("trace", ""), data.get("cost", {}))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.case), "id": self.case.id, "status": self.status, "message": self.message,
                "metrics": self.metrics, "tolerance": self.tolerance, "timings": self.timings, "cache": self.cache,
                **({"trace": self.trace} if self.trace else {}), **({"cost": self.cost} if self.cost else {})}

    def record(self) -> "CaseRecord":
        """The case as a run record holds it: the schema's type, read from the JSON it is written as."""
        import json

        from quantverdict.report.schema import CaseRecord

        return CaseRecord.model_validate(json.loads(json.dumps(self.to_dict(), default=str)))


def enumerate_cases(model_names: Iterable[str], backend_names: Iterable[str],
                    offered: Callable[[str], frozenset[str]], precisions: list[str] | None = None) -> list[Case]:
    """Every model × precision × backend combination a backend offers (``offered(backend)``), in
    backend, model, precision order; ``precisions`` narrows the set (names validated)."""
    for name in precisions or []:
        get_recipe(name)
    out = []
    for backend in backend_names:
        available = offered(backend)
        for model in model_names:
            for precision in precisions or sorted(available, key=precision_rank):
                if precision in available:
                    out.append(Case(model, precision, backend))
    return out

