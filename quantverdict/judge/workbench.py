"""What judging a recipe needs from a run, and nothing more: a model's spec, its FP32 and precision
graphs, its batches and FP32 outputs, a graph's outputs evaluated as written, and the cache. The run's
artifact store provides it (:class:`quantverdict.run.artifacts.ArtifactStore`); sensitivity, fallback,
format fit, recipe comparison and speedup floors take this, never the store itself, so judging depends
on the run's artifacts only through these methods."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from quantverdict.cache import Cache
from quantverdict.judge.layer_errors import Errors
from quantverdict.models.data import Data
from quantverdict.models.spec import Batch, ModelSpec
from quantverdict.precision.base import Recipe
from quantverdict.precision.qdq import QDQ


class Workbench(Protocol):
    cache: Cache

    def spec(self, model: str) -> ModelSpec: ...

    def module(self, model: str) -> Any: ...  # a torch.nn.Module (torch is imported only where one is built)

    def fp32_onnx(self, model: str) -> Path: ...

    def fp32_sha256(self, model: str) -> str: ...

    def precision_onnx(self, model: str, recipe: Recipe) -> Path: ...

    def batches(self, model: str, data: Data) -> list[Batch]: ...

    def data_key(self, model: str, data: Data) -> str: ...

    def fp32_outputs(self, model: str, data: Data) -> dict[str, np.ndarray]: ...

    def graph_semantics(self, model: str, path: Path, data: Data = "evaluation") -> dict[str, np.ndarray]: ...

    def recipe_semantics(self, model: str, recipe: Recipe, data: Data = "evaluation") -> dict[str, np.ndarray]:
        """As ``graph_semantics`` of ``precision_onnx``, without keeping the graph (made to be evaluated once)."""
        ...

    def layers_alone_errors(self, model: str, recipe: QDQ, layers: Sequence[str], data: Data = "evaluation",
                            kept_in: str | None = None) -> list[Errors]:
        """Each layer quantized alone (``recipe`` with ``only``), or kept alone in the wider format ``kept_in``, made
        together, as its errors against the FP32 outputs on ``data``
        (:class:`quantverdict.judge.layer_errors.Errors`)."""
        ...

    def undecided(self, model: str) -> np.ndarray | None: ...

    def output_kinds(self, model: str) -> dict[str, str]: ...  # each output's (quantverdict.judge.output_kinds)

    def onnxruntime_cpu_parts(self, *code: str) -> list[Any]:
        """Key parts of anything ONNX Runtime computes on this CPU (its version, the CPU, the source of the ``code`` modules)."""
        ...
