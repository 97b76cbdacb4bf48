"""Polygraphy's elementwise verdict (``polygraphy run --atol --rtol``): an element fails only where it exceeds both
bounds."""
from __future__ import annotations

import numpy as np


def within_bounds(name: str, ref: np.ndarray, out: np.ndarray, atol: float, rtol: float) -> float:
    """Polygraphy's verdict as a number: 1 where it passes, else the fraction of elements within bounds (below 1)."""
    diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    within = float(np.mean((diff <= atol) | (diff <= rtol * np.abs(ref.astype(np.float64)))))
    return 1.0 if _polygraphy_passes(name, ref, out, atol, rtol) else min(within, float(np.nextafter(1.0, 0.0)))


def _polygraphy_passes(name: str, ref: np.ndarray, out: np.ndarray, atol: float, rtol: float) -> bool:
    _import_torch_first()
    from polygraphy.comparator import IterationResult
    from polygraphy.comparator.compare import SimpleCompareFunc
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.CRITICAL  # its per-output report would flood the log
    compare_func = SimpleCompareFunc(atol=atol, rtol=rtol)
    results = compare_func(IterationResult({name: out}, runner_name="candidate"),
                           IterationResult({name: ref}, runner_name="reference"))
    return bool(results[name])


def _import_torch_first() -> None:
    """Polygraphy asks whether torch imports (``is_torch`` → ``is_importable``) inside a bare ``except:``,
    which swallows a Ctrl-C landing in that import and leaves torch half-initialised (the process then
    crashed at exit); importing it here first, where an interrupt propagates, leaves it nothing to import."""
    import importlib.util
    import sys

    if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401

