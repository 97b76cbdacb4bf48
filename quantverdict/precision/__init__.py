"""Precision recipes by name. Adding a precision means adding one entry here, or, from an installed
package, one entry point in the ``quantverdict.precisions`` group (``name = "module:recipe"``). Names are
listed without importing any recipe (their modules import onnx and NumPy)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from quantverdict.registry import Registry

if TYPE_CHECKING:
    from quantverdict.precision.base import Recipe

__all__ = ["Recipe", "get_recipe", "known_precisions", "precision_rank"]

ENTRY_POINT_GROUP = "quantverdict.precisions"
_RECIPES: "Registry[Recipe]" = Registry("precision", ENTRY_POINT_GROUP)
for _name, _ref in (("fp32", "floating:FP32_RECIPE"), ("tf32", "floating:TF32_RECIPE"), ("fp16", "floating:FP16_RECIPE"),
                    ("bf16", "floating:BF16_RECIPE"), ("int8", "qdq:INT8_RECIPE"), ("fp8", "qdq:FP8_RECIPE"),
                    ("fp4", "fp4:FP4_RECIPE")):
    _RECIPES.add(_name, f"quantverdict.precision.{_ref}")


def get_recipe(name: str) -> "Recipe":
    """The recipe for ``name``; an unknown name raises an error listing the known ones."""
    return _RECIPES.get(name)


def known_precisions() -> list[str]:
    """Every precision's name: the built-ins from FP32 to FP4, then installed packages' (tables and markers follow it)."""
    return _RECIPES.names()


def precision_rank(name: str) -> int:
    """A precision's place in that order (an unknown name last)."""
    order = known_precisions()
    return order.index(name) if name in order else len(order)


def __getattr__(name: str) -> object:  # ``from quantverdict.precision import Recipe`` without eager imports
    if name == "Recipe":
        from quantverdict.precision.base import Recipe

        return Recipe
    raise AttributeError(name)
