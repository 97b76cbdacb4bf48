"""The shape of a run record: what the gate, history, merge and the page read from one. A record that
does not have it (a case that is a number, metrics as a list, a cosine as a string, no environment, a
status nobody defined) is refused when read, one line per problem naming the field's path, with the
gate's exit code for bad input (2), instead of a traceback halfway through judging it.

Numbers may be NaN or infinite here (JSON from Python writes them): what a non-finite metric means
is the gate's to judge (a regression), not the reader's. Fields the readers do not rely on are kept as
they are (``extra="allow"``), so records of this schema version with more in them still read.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # machine-written: a string is never a number


class Check(_Open):
    output: str
    metric: str
    observed: float
    bound: float
    higher_is_better: bool
    passed: bool


class Interval(_Open):
    low: float
    high: float


class OutputMetrics(_Open):
    cosine: float | None = None
    snr_db: float | None = None
    max_norm_err: float | None = None
    top1_agreement: float | None = None
    intervals: dict[str, Interval] = {}
    error_histogram: list[float] | None = None


class Task(_Open):
    accuracy: float
    reference_accuracy: float
    accuracy_drop_points: float  # every reader takes it: a record leaves it out or null only by hand
    intervals: dict[str, Interval] = {}


class Coverage(_Open):
    layers: int
    quantized: int
    quantized_layers: list[str] = []
    float_layers: list[str] = []


class Verdict(_Open):
    """The metrics of one view of a case: the runtime's outputs, or the recipe's semantics."""

    metrics: dict[str, OutputMetrics] = {}
    checks: list[Check] = []
    task: Task | None = None


class TradeoffPoint(_Open):
    share: float
    layers_in_float: int
    score_db: float
    passed: bool | None = None
    settings: dict[str, str | float | int | bool | list[str] | None] = {}
    chosen: bool = False


class Search(_Open):
    """What ``recipe: auto`` found (every candidate is kept as written; the page reads the trade-off)."""

    tradeoff: list[TradeoffPoint] = []
    note: str = ""


class RecipeVerdict(Verdict):
    passed: bool | None = None
    coverage: Coverage | None = None
    search: Search | None = None


class OutputFidelity(_Open):
    flip_fraction: float
    bound: float


class Fidelity(_Open):
    passed: bool
    outputs: list[OutputFidelity] = []


class Latency(_Open):
    median_ms: float
    items_per_s: float


class CaseMetrics(Verdict):
    coverage: Coverage | None = None  # what the backend ran in the precision, of the layers it should quantize
    recipe: RecipeVerdict | None = None
    fidelity: Fidelity | None = None
    latency: Latency | None = None


class CaseRecord(_Open):
    id: str
    model: str
    precision: str
    backend: str
    status: Literal["passed", "failed", "skipped", "error"]
    message: str = ""
    metrics: CaseMetrics = CaseMetrics()
    timings: dict[str, float] = {}
    cache: dict[str, int] = {}


class GPUInfo(_Open):
    name: str
    compute_capability: str


class Environment(_Open):
    runner_class: str | None = None
    git_commit: str | None = None
    host: str | None = None
    gpu: GPUInfo | None = None
    packages: dict[str, str | None] = {}


class Shard(_Open):
    index: int
    count: int


class RunRecord(_Open):
    schema_version: Literal[SCHEMA_VERSION]  # type: ignore[valid-type]
    run_id: str | None = None
    started: str
    duration_s: float
    environment: Environment
    summary: dict[str, int] = {}
    cache: dict[str, int] = {}
    shard: Shard | None = None  # a shard's record (run --shard i/n), for merge
    cases: list[CaseRecord]
