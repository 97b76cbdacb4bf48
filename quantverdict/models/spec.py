"""What the pipeline needs to know about a model: how to build it and what it consumes."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from quantverdict.hashing import content_hash, file_sha256, source_fingerprint
from quantverdict.capabilities import package_version
from quantverdict.errors import SIGINT_RECEIVED, HarnessError, InputDataError, UserCodeError
from quantverdict.registry import import_object

Batch = dict[str, np.ndarray]
"""One batch of named model inputs."""
BATCHES_IN_MEMORY = 16  # a batch's share of memory: calibration and evaluation sets, a forward pass's activations


def sample_count(batch: Batch) -> int:
    """How many samples ``batch`` holds (its inputs with a batch axis share it; one where every input is a 0-d
    scalar)."""
    return next((len(values) for values in batch.values() if np.ndim(values)), 1)


@dataclass(frozen=True)
class InputSpec:
    """A named input: its shape (batch first), dtype, value range and dynamic axes; ``resolution``,
    where known, is the step its data was recorded with, in the units the model reads (8-bit pixels
    scaled to [-1, 1]: 2/255), below which a classifier's decision is not the input's
    (:mod:`quantverdict.judge.decided`)."""

    name: str
    shape: tuple[int, ...]  # () for a scalar: a 0-d tensor, no batch axis (a sample rate)
    dtype: str = "float32"
    value_range: tuple[float, float] = (-1.0, 1.0)
    dynamic_axes: Mapping[int, str] = field(default_factory=lambda: {0: "batch"})
    resolution: float | None = None
    value: float | None = None  # every batch's value, where fixed (a sample rate, a flag); filled in where omitted

    def __post_init__(self) -> None:
        if not self.shape and self.dynamic_axes:  # a scalar has no batch axis to be dynamic
            object.__setattr__(self, "dynamic_axes", {})

    def problem(self, values: np.ndarray) -> str | None:
        """What is wrong with ``values`` as this input (dtype kind, rank, fixed axes, rows, finiteness), or None."""
        declared = np.dtype(self.dtype)
        if values.dtype.kind != declared.kind and not (values.dtype.kind in "iu" and declared.kind in "iu"):
            return f"dtype {values.dtype} where the input is declared {self.dtype}"
        if values.ndim != len(self.shape):
            return f"shape {values.shape} where the input is declared {list(self.shape)}"
        fixed = [axis for axis in range(len(self.shape)) if axis not in self.dynamic_axes]
        wrong = [axis for axis in fixed if values.shape[axis] != self.shape[axis]]
        if wrong:
            return (f"shape {values.shape} where the input is declared {list(self.shape)} (axes "
                    f"{', '.join(map(str, sorted(self.dynamic_axes)))} free): axis {wrong[0]} differs")
        if values.size == 0:
            return f"shape {values.shape}: no values"
        if self.value is not None and not np.all(values == np.asarray(self.value, declared)):
            return f"values other than its declared value {self.value:g}"
        if declared.kind == "f":
            bad = int(values.size - np.count_nonzero(np.isfinite(values)))
            if bad:
                return f"{bad} of {values.size} values are NaN or infinite"
        return None

    def sample(self, rng: np.random.Generator, batch: int | None = None) -> np.ndarray:
        """Random values in ``value_range`` (integers for integer dtypes), or the declared ``value``."""
        shape = (batch or self.shape[0], *self.shape[1:]) if self.shape else ()
        if self.value is not None:
            return np.full(shape, self.value, self.dtype)
        low, high = self.value_range
        if np.issubdtype(np.dtype(self.dtype), np.integer):
            return rng.integers(int(low), int(high), size=shape, dtype=self.dtype)
        return rng.uniform(low, high, size=shape).astype(self.dtype)


@dataclass(frozen=True)
class DetectionFormat:
    """How a one-stage detector's raw head is laid out and read (:mod:`quantverdict.judge.detections`): YOLOv8's
    ``[batch, 4 + classes, anchors]`` by default, YOLOv5's ``[batch, anchors, 5 + classes]`` with ``objectness``."""

    boxes: Literal["cxcywh", "xyxy"] = "cxcywh"
    objectness: bool = False  # a score per anchor before the classes' (YOLOv5); the class score is their product
    attribute_axis: Literal[1, 2] | None = None  # the axis of box, objectness and classes; None: the shorter one
    score: float = 0.25  # the score threshold, as Ultralytics' predict
    # boxes as offsets on grids of these strides (YOLOX without its decoding), over an image of height × width:
    grid: tuple[int, ...] = ()  # x y = (offset + cell) × stride, w h = exp(w h) × stride (judge.detections)
    image: tuple[int, int] | None = None
    nms_iou: float = 0.45  # NMS's IoU threshold per class


@dataclass(frozen=True)
class SequenceFormat:
    """How a sequence output is read (:mod:`quantverdict.judge.sequences`): per-position distributions over symbols,
    decoded greedily as CTC does. ``batch_axis`` (1: ``[positions, batch, symbols]``, torch's CTC layout) is read from
    older manifests and not needed: every output is joined with its samples first (quantverdict.backends.samples)."""

    blank: int = 0
    batch_axis: Literal[0, 1] = 0


@dataclass(frozen=True)
class LabeledData:
    """Held-out inputs with labels, for a task-accuracy metric."""

    inputs: list[Batch]
    labels: np.ndarray


@dataclass(frozen=True)
class Ref:
    """A callable named ``"module:attribute"`` (with fixed arguments), imported on first call, so
    that listing, keying and judging models from caches never imports torch or a user's package."""

    target: str
    args: tuple[Any, ...] = ()

    def __call__(self, *more: Any) -> Any:
        try:
            function = import_object(self.target)
        except (ImportError, AttributeError, ValueError) as exc:
            raise HarnessError(f"cannot import {self.target}: {type(exc).__name__}: {exc}") from exc
        return function(*self.args, *more)

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]


def _what(value: Any) -> str:
    return f"an empty {type(value).__name__}" if hasattr(value, "__len__") and not len(value) else \
        f"a {type(value).__name__}"


ROLES = {"build": "model factory", "calibration": "calibration callable", "eval_data": "evaluation callable",
         "metric": "metric"}

Calibration = Literal["synthetic"] | Callable[[], list[Batch]] | None
BUILD_PACKAGES = ("torch", "torchvision", "scikit-learn")  # versions in every build key (digits ship in sklearn)


@dataclass(frozen=True)
class ModelSpec:
    """A model the harness can export, quantize, run and judge.

    Exactly one of ``build`` (a torch module factory) and ``onnx_path`` (a user ONNX file) is set.
    ``quantized`` names, per precision, a graph the user quantized elsewhere (Model Optimizer, ONNX
    Runtime, Brevitas…): it replaces the harness's recipe for that precision and is judged the same way.
    ``calibration`` must be given explicitly for quantized precisions: a callable returning
    batches, or ``"synthetic"`` to calibrate on inputs drawn from the input specs (an explicit
    choice, since INT8 without real data is only as good as that data).
    """

    name: str
    inputs: Sequence[InputSpec]
    outputs: Sequence[str]
    output_kinds: Mapping[str, str] = field(default_factory=dict)  # declared kinds (quantverdict.judge.output_kinds)
    thresholds: Mapping[str, float] = field(default_factory=dict)  # where an application cuts a probability map
    detections: Mapping[str, DetectionFormat] = field(default_factory=dict)  # the detector heads among the outputs
    sequences: Mapping[str, SequenceFormat] = field(default_factory=dict)  # the CTC-decoded outputs
    build: Callable[[], "object"] | None = None
    onnx_path: Path | None = None
    task: Literal["classification", "regression", "embedding"] = "regression"
    calibration: Calibration = None
    eval_data: Callable[[], LabeledData | list[Batch]] | None = None  # labelled, or inputs alone
    tolerances: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    unsupported_ops: Mapping[str, Sequence[str]] = field(default_factory=dict)  # backend → op types
    quantized: Mapping[str, Path] = field(default_factory=dict)  # precision → the user's own quantized ONNX
    # The task's own metric (quantverdict.judge.task_metrics): (reference, candidate, labels) → named
    # scores, bounded by the tolerances' task_min/task_max. Embedding models get one by default.
    metric: Callable[..., Mapping[str, float]] | None = None
    # Recipe settings per precision (quantverdict.precision.qdq.QDQ.configured), e.g. {"int8": {"smoothquant": 0.5}}
    recipe: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    slow: bool = False
    seed: int = 0
    # Files the build reads (weights, training data). Declaring them, even as an empty list, says
    # that the build is a function of its source and these files only: it is then keyed without
    # being run (build_key), and warm runs never build the module. None: not declared.
    build_files: Sequence[Path] | None = None

    def __post_init__(self) -> None:
        if (self.build is None) == (self.onnx_path is None):
            raise ValueError(f"model {self.name!r}: give exactly one of build= and onnx_path=")

    def evaluation(self) -> tuple[list[Batch], np.ndarray | None] | None:
        """The evaluation inputs and their labels (None where given without labels), or None when
        the model has no evaluation set of its own (synthetic batches are drawn instead)."""
        if self.eval_data is None:
            return None
        data = self.call("eval_data")
        if isinstance(data, LabeledData):
            return self.check_batches(data.inputs, "eval_data"), data.labels
        return self.check_batches(data, "eval_data"), None

    def call(self, role: str, *args: Any) -> Any:
        """Call the spec's ``build``, ``calibration``, ``eval_data`` or ``metric``: the user's code, whose
        failure becomes a :class:`UserCodeError` naming the model, the callable and its role, with its trace."""
        function = self.task_metric() if role == "metric" else getattr(self, role)
        try:
            return function(*args)
        except HarnessError:
            raise
        except (Exception, SystemExit) as exc:  # sys.exit() in a user's callable ends their case, not the run
            raise UserCodeError(self.describe(role), exc) from exc
        except KeyboardInterrupt as exc:  # the user's Ctrl-C stops the run; one their code raised is their error
            if SIGINT_RECEIVED.is_set():
                raise
            raise UserCodeError(self.describe(role), exc) from exc

    def describe(self, role: str) -> str:
        """``model 'x': its calibration callable pkg.data:batches``, for messages about what it returned."""
        function = self.task_metric() if role == "metric" else getattr(self, role)
        name = function.target if isinstance(function, Ref) else \
            f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', repr(function))}"
        return f"model {self.name!r}: its {ROLES.get(role, role)} {name}"

    def check_batches(self, batches: Any, role: str) -> list[Batch]:
        """``batches`` as a user's callable returned them, checked against the declared inputs: a list of
        {input name: array} with every input, of its dtype kind and rank, its fixed axes as declared, at
        least one row, and finite values; anything else is an :class:`InputDataError` naming the callable,
        the batch and the input. Arrays come back as NumPy arrays of the declared dtype (float64 data, or a CPU
        torch tensor, for a float32 input is what the model reads, converted once here)."""
        where = self.describe(role)
        if not isinstance(batches, (list, tuple)) or not batches:
            raise InputDataError(f"{where} returned {_what(batches)}; expected a non-empty list of "
                                 f"{{input name: array}} batches")
        filled: list[dict[str, Any]] = []  # with the inputs of a declared value, where a batch leaves them out
        for index, batch in enumerate(batches):
            if not isinstance(batch, dict):
                raise InputDataError(f"{where}: batch {index} is {_what(batch)}, not a {{input name: array}} dict")
            rows = sample_count(batch) if batch else None
            batch = {**batch, **{spec.name: spec.sample(np.random.default_rng(0), rows)
                                 for spec in self.inputs if spec.value is not None and spec.name not in batch}}
            filled.append(batch)
            missing = [spec.name for spec in self.inputs if spec.name not in batch]
            unknown = sorted(set(batch) - {spec.name for spec in self.inputs})
            if missing or unknown:
                raise InputDataError(f"{where}: batch {index} has inputs {sorted(batch)}; the model's are "
                                     f"{[spec.name for spec in self.inputs]}")
            for spec in self.inputs:
                try:
                    values = np.asarray(batch[spec.name])
                except (TypeError, ValueError, RuntimeError) as exc:  # a CUDA tensor, a ragged list
                    raise InputDataError(f"{where}: batch {index}, input {spec.name!r}: {_what(batch[spec.name])} "
                                         f"is not an array NumPy can read ({exc})") from None
                problem = spec.problem(values)
                if problem:
                    raise InputDataError(f"{where}: batch {index}, input {spec.name!r}: {problem}")
        return [{spec.name: np.asarray(batch[spec.name], dtype=spec.dtype) for spec in self.inputs} for batch in filled]

    def batch_bytes(self) -> int:
        """The bytes of one batch of the declared inputs."""
        return sum(int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize for spec in self.inputs)

    def memory_problem(self, memory: int | None) -> str | None:
        """Why this machine's ``memory`` (bytes) cannot hold the model's work, judged before anything is built: a
        batch of its declared inputs above 1/:data:`BATCHES_IN_MEMORY` of it (the calibration and evaluation sets
        and the activations of a forward pass are each several batches), or None."""
        size = self.batch_bytes()
        if memory is None or size * BATCHES_IN_MEMORY <= memory:
            return None
        shapes = ", ".join(f"{spec.name} {list(spec.shape)} {spec.dtype}" for spec in self.inputs)
        return (f"model {self.name!r}: one batch of its declared inputs ({shapes}) is {size / 2 ** 30:.3g} GiB; this "
                f"machine's {memory / 2 ** 30:.3g} GiB hold at most {memory / BATCHES_IN_MEMORY / 2 ** 30:.3g} GiB a "
                "batch: declare a smaller batch or shape")

    def task_metric(self) -> Callable[..., Mapping[str, float]] | None:
        if self.metric is None and self.task == "embedding":
            return Ref("quantverdict.judge.task_metrics:embedding_agreement")
        return self.metric

    def declared_unsupported(self, backend: str, ops: Sequence[str]) -> bool:
        """True when every op a backend rejected is declared unsupported for it in this spec."""
        declared = set(self.unsupported_ops.get(backend, ()))
        return bool(ops) and set(ops) <= declared

    def sample_batches(self, count: int, seed: int, batch: int | None = None) -> list[Batch]:
        """Deterministic synthetic batches drawn from the input specs."""
        rng = np.random.default_rng(seed)
        return [{spec.name: spec.sample(rng, batch) for spec in self.inputs} for _ in range(count)]

    def build_key(self) -> str | None:
        """A content key of everything that makes the torch module, found without building it:
        the build's name and arguments, its package's source, the seed, the I/O, torch's and
        torchvision's versions and the declared build files. None where that is not known to be
        everything: a model not built by the harness's own code and declaring no ``build_files``."""
        if self.build is None:
            return None
        module = self.build.module if isinstance(self.build, Ref) else getattr(self.build, "__module__", "")
        name = self.build.target if isinstance(self.build, Ref) else \
            f"{module}:{getattr(self.build, '__qualname__', '<unnamed>')}"
        builtin = module.startswith("quantverdict.models")
        if (not builtin and self.build_files is None) or "<" in name or module in ("", "__main__"):
            return None  # lambdas and closures carry state their source does not show
        package = "quantverdict.models" if builtin else module.split(".")[0]
        return content_hash("build", self.name, name, [repr(a) for a in getattr(self.build, "args", ())], self.seed,
                            [repr(i) for i in self.inputs], list(self.outputs), source_fingerprint(package),
                            {p: package_version(p) for p in BUILD_PACKAGES},
                            [(str(f), file_sha256(Path(f))) for f in (self.build_files or ())])
