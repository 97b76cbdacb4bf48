"""What a precision graph means, independent of any runtime's kernels.

ONNX Runtime's CPU provider with every graph optimisation off executes each node as written:
QuantizeLinear rounds (half to even) and saturates, DequantizeLinear multiplies back, and the
Conv/Gemm/MatMul between them run in float on the dequantized values. No node is fused into an
integer kernel, so the result is the Q/DQ graph's own semantics, the same on every CPU up to the
float rounding of the float ops. A graph of integer operators (``MatMulInteger``, ``QLinearConv``…) has
no such reading under ONNX Runtime, whose integer kernels differ by instruction set even unfused: it is
evaluated in exact integer arithmetic instead (:mod:`quantverdict.judge.integer`). Recipes are judged on
this; runtimes are judged against it (:mod:`quantverdict.judge.fidelity`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import onnx

from quantverdict.backends import infer_all
from quantverdict.backends.onnxrt import OnnxRuntimeRunner
from quantverdict.backends.samples import CODE as JOINING
from quantverdict.cache import Cache
from quantverdict.hashing import file_sha256
from quantverdict.judge.integer import evaluate_exact, has_integer_ops, reference_evaluable
from quantverdict.models.spec import Batch

AS_WRITTEN = "onnxruntime CPU, graph optimisations off (Q/DQ as written)"
EXACT = "ONNX reference evaluator, integer operators in exact integer arithmetic"
KERNELS = ("onnxruntime CPU's integer kernels, graph optimisations off: contrib-domain operators ONNX does not define; "
           "their results depend on the CPU's instruction set")
CODE = ("quantverdict.judge.semantics", "quantverdict.judge.integer", JOINING)


def evaluator(model: onnx.ModelProto) -> str:
    """What evaluates ``model``'s semantics: exact integer arithmetic where the graph has integer operators
    and ONNX defines every node of it, ONNX Runtime with its optimisations off otherwise (a graph of integer
    operators with contrib-domain ones, ``DynamicQuantizeLSTM``, is then its instruction-set-dependent kernels', and
    labelled so, not as Q/DQ as written)."""
    if not has_integer_ops(model):
        return AS_WRITTEN
    return EXACT if reference_evaluable(model) else KERNELS


def evaluate_semantics(path: Path, batches: Sequence[Batch], threads: int = 0) -> dict[str, np.ndarray]:
    """The graph's outputs over ``batches``, each node evaluated exactly as written (by ONNX Runtime on ``threads``
    intra-op threads, 0 for its default)."""
    model = onnx.load(str(path))
    if evaluator(model) == EXACT:
        return evaluate_exact(model, batches)
    with OnnxRuntimeRunner(path, ["CPUExecutionProvider"], optimize=False, threads=threads) as runner:
        return infer_all(runner, batches)


def unkept_semantics(graph: bytes, batches: Sequence[Batch], threads: int = 0,
                     evaluated_by: str | None = None, floats_optimised: bool = False) -> dict[str, np.ndarray]:
    """:func:`evaluate_semantics` of a graph made only to be evaluated, from its bytes (no file). ``evaluated_by``
    (:func:`evaluator`'s answer) where the caller knows it without parsing the graph: each layer quantized alone is
    evaluated as the prepared graph it came from would be, and parsing a transformer's copy per layer cost a tenth
    of the evaluation. ``floats_optimised``: its float nodes optimised by ONNX Runtime, its Q/DQ as written (up to the
    float kernels' last bits: :func:`~quantverdict.precision.exposing.quantizers_as_written_options`)."""
    if evaluated_by is None:
        evaluated_by = evaluator(onnx.load_from_string(graph))
    if evaluated_by == EXACT:
        return evaluate_exact(onnx.load_from_string(graph), batches)
    with OnnxRuntimeRunner(graph, ["CPUExecutionProvider"], optimize=floats_optimised, threads=threads,
                           quantizers_as_written=True) as runner:
        return infer_all(runner, batches)


@dataclass(frozen=True)
class Semantics:
    """The loader of a graph's semantics over batches: cached by the graph's bytes, the batches' key, and
    ``cpu_parts`` (ONNX Runtime's version, the CPU and this code: what can move a float op's last bits)."""

    graph: Path
    batches: Callable[[], Sequence[Batch]]
    batches_key: str
    cpu_parts: list[Any]
    cache: Cache
    describe: dict[str, Any]

    def __call__(self) -> dict[str, np.ndarray]:
        parts = [file_sha256(self.graph), self.batches_key, *self.cpu_parts]
        return self.cache.arrays("semantics", parts, lambda: (evaluate_semantics(self.graph, self.batches()), ""),
                                 self.describe)[0]
