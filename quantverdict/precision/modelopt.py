"""NVIDIA Model Optimizer's ONNX post-training quantization as a recipe provider.

Model Optimizer pins its own onnx and onnxruntime(-gpu), so it lives in an environment of its own
(``pip install 'nvidia-modelopt[onnx]'`` into a separate virtual environment) and runs here as a
subprocess: ``QUANTVERDICT_MODELOPT_PYTHON`` names that environment's Python (or the current one, if it
imports ``modelopt``). The FP32 graph and the harness's calibration batches go in; Model Optimizer's
Q/DQ graph, with its own placement and calibration (``calibration``: its method, default entropy
for INT8 and max for FP8), comes out with ``high_precision_dtype`` fp32 so it differs from the FP32
graph only by its quantization, and is judged exactly as the harness's own recipes are.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx

from quantverdict.errors import HarnessError
from quantverdict.models.spec import Batch
from quantverdict.precision.base import Recipe
from quantverdict.precision.coverage import left_by

ENVIRONMENT = "QUANTVERDICT_MODELOPT_PYTHON"


def modelopt_python() -> str | None:
    """The Python that runs Model Optimizer: ``$QUANTVERDICT_MODELOPT_PYTHON``, else this one if it has it."""
    configured = os.environ.get(ENVIRONMENT)
    if configured:
        return configured
    return sys.executable if importlib.util.find_spec("modelopt") is not None else None


class ModelOptimizerQDQ(Recipe):
    quantized = True
    calibration_data = True  # Model Optimizer calibrates from the batches itself

    def __init__(self, name: str, method: str | None = None):
        self.name, self.method = name, method

    def params(self) -> dict[str, Any]:
        return {**super().params(), "quantizer": "nvidia-modelopt", "calibration_method": self.method,
                "high_precision_dtype": "fp32", "modelopt": _version(modelopt_python())}

    def float_reasons(self, source: onnx.ModelProto) -> dict[str, str]:
        return left_by(source, "NVIDIA Model Optimizer's placement")

    def apply_batches(self, model: onnx.ModelProto, batches: Sequence[Batch]) -> onnx.ModelProto:
        python = modelopt_python()
        if python is None:
            raise HarnessError(f"NVIDIA Model Optimizer is not installed: set {ENVIRONMENT} to the Python of an "
                               "environment with nvidia-modelopt[onnx] (it pins its own onnx and onnxruntime)")
        with tempfile.TemporaryDirectory() as folder:
            source, data, target = (Path(folder) / name for name in ("fp32.onnx", "calibration.npz", "quantized.onnx"))
            onnx.save(model, str(source))
            np.savez(data, **{name: np.concatenate([b[name] for b in batches]) for name in batches[0]})
            command = [python, "-m", "modelopt.onnx.quantization", "--onnx_path", str(source), "--quantize_mode",
                       self.name, "--calibration_data_path", str(data), "--calibration_eps", "cpu",
                       "--high_precision_dtype", "fp32", "--output_path", str(target)]
            if self.method:
                command += ["--calibration_method", self.method]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0 or not target.is_file():
                raise HarnessError(f"Model Optimizer ({python}) failed to quantize graph {model.graph.name!r} to "
                                   f"{self.name}: {(done.stderr or done.stdout)[-2000:]}")
            return onnx.load(str(target))


@functools.lru_cache(maxsize=4)
def _version(python: str | None) -> str | None:
    """The Model Optimizer version that ``python`` imports (part of the graph's cache key)."""
    if python is None:
        return None
    done = subprocess.run([python, "-c", "import modelopt; print(modelopt.__version__)"], capture_output=True, text=True)
    return done.stdout.strip() or None
