"""``recipe: {int8: {auto: true, …}}``: a model's request that the search choose its recipe, and the search's own
settings, parsed and checked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from quantverdict.errors import CalibrationError
from quantverdict.precision.settings import Formats, RecipeSettings, flag, number, wider_formats

AUTO_KEYS = ("auto", "budget_s", "max_fallback", "wider_formats")
BESIDE_AUTO = ("recurrent",)  # recipe settings a user may fix beside the search (the runtime's, not the recipe's)
DEFAULT_BUDGET_S = 7200.0  # a stop for a search that runs away, not a budget: the work is fixed (stages)
DEFAULT_MAX_FALLBACK = 0.1
DEFAULT_WIDER: Formats = ("fp16", "fp32")  # FP8 needs an FP8 GPU (compute capability ≥ 8.9): the user offers it


@dataclass(frozen=True)
class AutoSettings:
    """``recipe: {int8: {auto: true, budget_s: 7200, max_fallback: 0.1, wider_formats: [fp16, fp32]}}``: the
    search's own settings; ``wider_formats`` are those fallback may keep a layer in, narrowest first (``[fp8, fp16,
    fp32]`` where every GPU the recipe deploys to runs FP8: compute capability 8.9 and later)."""

    budget_s: float = DEFAULT_BUDGET_S
    max_fallback: float = DEFAULT_MAX_FALLBACK
    wider_formats: Formats = DEFAULT_WIDER
    recurrent: str = "float"  # a recipe setting the user fixes beside the search: it is the runtime's choice

    def fixed(self) -> RecipeSettings:
        """The recipe settings every candidate takes, and the chosen one with them: ``recurrent: dynamic`` (the LSTMs
        in ONNX Runtime's INT8 kernel) where set."""
        return RecipeSettings() if self.recurrent == "float" else RecipeSettings(recurrent=self.recurrent)


def auto_settings(settings: Mapping[str, Any]) -> AutoSettings | None:
    """The search's settings where ``settings`` asks for one (``auto: true``), else None; a recipe setting
    beside ``auto`` is refused: the search chooses them all (remove ``auto`` to set them by hand)."""
    if "auto" not in settings:
        return None
    if not flag(settings["auto"], "recipe auto"):
        beside = sorted(set(settings) & set(AUTO_KEYS) - {"auto"})
        if beside:
            raise CalibrationError(f"recipe auto is false, so {', '.join(beside)} (the search's own settings) "
                                   "cannot apply: remove them, or set auto: true")
        return None
    refused = sorted(set(settings) - set(AUTO_KEYS) - set(BESIDE_AUTO))
    if refused:
        raise CalibrationError(f"recipe auto chooses every setting, so {', '.join(refused)} cannot be set beside it "
                               "(remove auto to set them by hand)")
    budget = number(settings.get("budget_s", DEFAULT_BUDGET_S), "recipe auto: budget_s")
    share = number(settings.get("max_fallback", DEFAULT_MAX_FALLBACK), "recipe auto: max_fallback")
    if budget < 0 or not 0 <= share < 1:
        raise CalibrationError(f"recipe auto: budget_s {budget} must be ≥ 0 and max_fallback {share} in [0, 1)")
    recurrent = RecipeSettings.parse({"recurrent": settings.get("recurrent", "float")}, "recipe auto").recurrent
    return AutoSettings(budget, share, wider_formats(settings.get("wider_formats", list(DEFAULT_WIDER)),
                                                     "recipe auto: wider_formats"), str(recurrent))
