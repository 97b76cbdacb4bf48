"""Precision recipes by name. Adding a precision means adding one entry here."""
from __future__ import annotations

from quantverdict.precision.base import Recipe
from quantverdict.precision.floating import FP32, TF32, RoundedStorage
from quantverdict.precision.fp4 import NVFP4Weights
from quantverdict.precision.qdq import FP8_E4M3, INT8, QDQ
from quantverdict.registry import Registry

__all__ = ["Recipe", "get_recipe", "known_precisions"]



_RECIPES: Registry[Recipe] = Registry("precision")
_RECIPES.add("fp32", FP32())
_RECIPES.add("tf32", TF32())
_RECIPES.add("fp16", RoundedStorage("fp16"))
_RECIPES.add("bf16", RoundedStorage("bf16"))
_RECIPES.add("int8", QDQ(INT8))
_RECIPES.add("fp8", QDQ(FP8_E4M3))
_RECIPES.add("fp4", NVFP4Weights())


def get_recipe(name: str) -> Recipe:
    """The recipe for ``name``; an unknown name raises an error listing the known ones."""
    return _RECIPES.get(name)


def known_precisions() -> list[str]:
    return _RECIPES.names()
