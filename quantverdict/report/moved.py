"""What moved between two runs of a case, said beside a regression: the graph, the data, the recipe, the tolerance,
a package, the runner class, or nothing recorded. When a verdict changes, the next question is why; the record keeps
each case's fingerprint (:class:`quantverdict.report.schema.Fingerprint`) and the run's packages and runner class,
so the answer is read off the two records. Where the recipe's graph and its semantics are the same in both and the
runtime's outputs moved, it is the runtime."""
from __future__ import annotations

from quantverdict.report.schema import CaseRecord, Environment

PARTS = {"graph": "the FP32 graph", "evaluation": "the evaluation data", "calibration": "the calibration data",
         "recipe": "the recipe settings", "qdq": "the precision graph",
         "engine": "the engine's build options (TensorRT's flags, shapes, GPU)",
         "plan": "the engine (the tactics its build chose: TensorRT's timing cache and builder)",
         "tolerance": "the tolerance"}
DECIDING = ("quantverdict", "onnx", "onnxruntime", "onnxruntime-gpu", "onnxruntime_gpu", "torch", "torchvision",
            "tensorrt", "tensorrt_rtx", "numpy", "polygraphy", "onnx_graphsurgeon")


def moved(old: CaseRecord, new: CaseRecord, old_env: Environment | None = None,
          new_env: Environment | None = None) -> str:
    """One line: what differs between the two runs of the case, as far as the records tell."""
    found = []
    before, now = old.metrics.fingerprint, new.metrics.fingerprint
    if before is not None and now is not None:
        found += [words for part, words in PARTS.items()
                  if getattr(before, part) is not None and getattr(now, part) is not None
                  and getattr(before, part) != getattr(now, part)]
    if old.metrics.runtime and new.metrics.runtime and old.metrics.runtime != new.metrics.runtime:
        found.append(f"the runtime ({old.metrics.runtime} → {new.metrics.runtime})")
    if old_env is not None and new_env is not None:
        found += [f"{name} {old_env.packages.get(name)} → {new_env.packages.get(name)}" for name in DECIDING
                  if old_env.packages.get(name) != new_env.packages.get(name)
                  and (name in old_env.packages or name in new_env.packages)]
        if old_env.runner != new_env.runner:
            found.append(f"the runner class ({old_env.runner} → {new_env.runner})")
    unknown = "; a record without fingerprints cannot tell graph, data and recipe apart" \
        if before is None or now is None else ""
    line = f"moved: {', '.join(found)}{unknown}" if found else \
        f"moved: nothing the records hold{unknown or ' (graph, data, recipe, tolerance, packages and runner)'}"
    same_recipe = before is not None and now is not None and before.qdq == now.qdq and before.qdq is not None
    old_recipe, new_recipe = old.metrics.recipe, new.metrics.recipe
    if same_recipe and old_recipe and new_recipe and old_recipe.measured().snr_db == new_recipe.measured().snr_db:
        line += "; the recipe's graph and its semantics are the same in both: the runtime moved, not the recipe"
    return line
