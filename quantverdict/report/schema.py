"""The shape of a run record, and the typed record the gate, history, merge and the page read (what
:func:`quantverdict.report.load.load_record` returns). A record that
does not have it (a case that is a number, metrics as a list, a cosine as a string, no environment, a
status nobody defined) is refused when read, one line per problem naming the field's path, with the
gate's exit code for bad input (2), instead of a traceback halfway through judging it.

Numbers may be NaN or infinite here (JSON from Python writes them): what a non-finite metric means
is the gate's to judge (a regression), not the reader's. Fields the readers do not rely on are kept as
they are (``extra="allow"``), so records of this schema version with more in them still read.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from quantverdict.tune.result import Cost, TradeoffPoint

SCHEMA_VERSION = 1


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # machine-written: a string is never a number


class CheckRecord(_Open):
    output: str
    metric: str
    observed: float
    bound: float
    higher_is_better: bool
    passed: bool


class IntervalRecord(_Open):
    low: float
    high: float


class OutputMetrics(_Open):
    cosine: float | None = None
    snr_db: float | None = None
    max_norm_err: float | None = None
    top1_agreement: float | None = None
    label_agreement: float | None = None  # a labels output's: the share of its elements equal to FP32's
    nonfinite: float | None = None
    intervals: dict[str, IntervalRecord] = {}
    error_histogram: list[float] | None = None


class Task(_Open):
    accuracy: float
    reference_accuracy: float
    accuracy_drop_points: float  # every reader takes it: a record leaves it out or null only by hand
    intervals: dict[str, IntervalRecord] = {}


class Coverage(_Open):
    layers: int
    quantized: int
    quantized_layers: list[str] = []
    float_layers: list[str] = []


class ViewRecord(_Open):
    """The metrics of one view of a case: the runtime's outputs, or the recipe's semantics."""

    metrics: dict[str, OutputMetrics] = {}
    checks: list[CheckRecord] = []
    notes: list[str] = []  # what the comparison noted: a bound widened to the samples, outputs the input barely moves
    task: Task | None = None

    def measured(self) -> OutputMetrics:
        """The metrics of the case's measured output, the headline a reader compares: the first holding no decisions
        (labels' metrics carry their agreement), as a search scores (:func:`quantverdict.judge.output_kinds.measured`),
        else the first (all None where it has none)."""
        each = list(self.metrics.values()) or [OutputMetrics()]
        return next((metrics for metrics in each if metrics.label_agreement is None), each[0])


class SearchRecord(_Open):
    """What ``recipe: auto`` found (every candidate is kept as written; the page reads the trade-off and the cost)."""

    tradeoff: list[TradeoffPoint] = []
    note: str = ""
    cost: Cost | None = None


class LockRecord(_Open):
    """The lock a case's recipe came from (:class:`quantverdict.tune.lock.LockState`)."""

    path: str
    current_graph: bool = True
    current_calibration: bool = True
    note: str | None = None  # where it does not match this run (other inputs, another precision graph): what, and why
    search_note: str | None = None  # the locking search's word where its choice missed the case's bounds


class RecipeVerdict(ViewRecord):
    passed: bool | None = None
    coverage: Coverage | None = None
    search: SearchRecord | None = None
    lock: LockRecord | None = None
    settings: dict[str, Any] = {}  # the recipe's parameters as resolved (a user's graph: how it is quantized)


class OutputFidelityRecord(_Open):
    flip_fraction: float
    bound: float
    output: str = "?"


class FidelityRecord(_Open):
    passed: bool
    outputs: list[OutputFidelityRecord] = []


class Latency(_Open):
    median_ms: float
    items_per_s: float


class Divergence(_Open):
    """The first layer of the precision graph, evaluated as written, that leaves the FP32 graph."""

    node: str
    op: str
    summary: str = ""


class Fingerprint(_Open):
    """Content keys of what decides a case's verdict, to say what moved between two runs of it
    (:mod:`quantverdict.report.moved`)."""

    graph: str | None = None  # the FP32 graph's sha256
    evaluation: str | None = None  # the evaluation batches' content key
    calibration: str | None = None  # the calibration batches' (quantized precisions)
    recipe: str | None = None  # the recipe's settings as resolved (layers kept wider and their formats included)
    qdq: str | None = None  # the precision graph's sha256 (the recipe's graph, a user's own)
    engine: str | None = None  # an engine's build options (TensorRT's flags, shapes, GPU)
    plan: str | None = None  # the engine's sha256: the tactics its build chose (TensorRT's timing cache, builder)
    tolerance: str | None = None  # the bounds applied


class BaselineRecord(_Open):
    """A case judged against a baseline run's same case (``pytest --qv-baseline``)."""

    path: str
    found: bool = True
    regressions: list[str] = []
    improvements: list[str] = []
    moved: str | None = None  # beside a regression: what moved between the runs (quantverdict.report.moved)


class CaseMetrics(ViewRecord):
    fingerprint: Fingerprint | None = None
    runtime: str | None = None  # what ran the case (package, provider, optimisations)
    baseline: BaselineRecord | None = None
    coverage: Coverage | None = None  # what the backend ran in the precision, of the layers it should quantize
    recipe: RecipeVerdict | None = None
    fidelity: FidelityRecord | None = None
    latency: Latency | None = None
    first_divergence: Divergence | None = None


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
    cost: Cost | None = None  # its CPU-seconds (its workers' too) and peak memory (the process's while it ran)

    @property
    def judged(self) -> bool:
        """Passed or failed: a verdict was reached (not skipped, not an error)."""
        return self.status in ("passed", "failed")

    @property
    def reason(self) -> str:
        """The message's first line (a skip's reason, an error's cause)."""
        return (self.message.splitlines() or [""])[0]


class GPUInfo(_Open):
    name: str
    compute_capability: str


class Environment(_Open):
    runner_class: str | None = None
    git_commit: str | None = None
    host: str | None = None
    gpu: GPUInfo | None = None
    packages: dict[str, str | None] = {}

    @property
    def runner(self) -> str:
        return self.runner_class or "unknown (record predates runner classes)"


class ShardRecord(_Open):
    index: int
    count: int
    positions: dict[str, int] = {}  # each case's place in the whole matrix (absent from older records)


class RunRecord(_Open):
    schema_version: Literal[SCHEMA_VERSION]  # type: ignore[valid-type]
    run_id: str | None = None
    started: str
    duration_s: float
    environment: Environment
    summary: dict[str, int] = {}
    cache: dict[str, int] = {}
    shard: ShardRecord | None = None  # a shard's record (run --shard i/n), for merge
    cases: list[CaseRecord]
