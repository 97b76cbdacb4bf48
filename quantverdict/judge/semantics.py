"""What a precision graph means, independent of any runtime's kernels.

ONNX Runtime's CPU provider with every graph optimisation off executes each node as written:
QuantizeLinear rounds (half to even) and saturates, DequantizeLinear multiplies back, and the
Conv/Gemm/MatMul between them run in float on the dequantized values. No node is fused into an
integer kernel, so the result is the Q/DQ graph's own semantics, the same on every CPU up to the
float rounding of the float ops. Recipes are judged on this; runtimes are judged against it
(:mod:`quantverdict.judge.fidelity`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from quantverdict.backends.onnxrt import OnnxRuntimeRunner
from quantverdict.judge.compare import concat
from quantverdict.models.spec import Batch

EVALUATOR = "onnxruntime CPU, graph optimisations off (Q/DQ as written)"


def evaluate_semantics(path: Path, batches: Sequence[Batch]) -> dict[str, np.ndarray]:
    """The graph's outputs over ``batches``, each node evaluated exactly as written."""
    with OnnxRuntimeRunner(path, ["CPUExecutionProvider"], optimize=False) as runner:
        return concat([runner.infer(batch) for batch in batches])
