"""Each weighted layer of a Q/DQ recipe quantized alone (sensitivity, fallback's ranking), made from one preparation,
one calibration and one weight rounding of the recipe's graph with every layer quantized.

A layer quantized alone (the recipe with ``only``) needs nothing of its own: preparation (SmoothQuant, equalization)
runs over every candidate layer whatever ``only`` says, calibration covers every tensor the whole recipe quantizes
(:meth:`QDQ.calibration_recipe`), and GPTQ rounds each layer on H from the prepared FP32 graph's inputs of that layer.
So its graph is the prepared graph with that layer's Q/DQ pairs and the whole recipe's rounded weight, the same bytes
the recipe with ``only`` makes by itself (a test holds it), without its own load, preparation, calibration and
rounding (on MiniLM 2.2 s of each single-layer evaluation's 2.8 s). A weight that two quantized layers read is rounded
for the layer alone, as the recipe with ``only`` rounds it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

from quantverdict.export.compat import serialized
from quantverdict.models.spec import Batch
from quantverdict.precision.base import Recipe
from quantverdict.precision.placement import QDQ_OPS
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.rescaling import Prepared, Rescaling


def derivable(recipe: Recipe) -> bool:
    """Whether :class:`LayerGraphs` makes ``recipe``'s single-layer graphs: a Q/DQ recipe whose correction is GPTQ's
    per-layer rounding at most (bias correction is measured with every layer's weights as they end up)."""
    return isinstance(recipe, QDQ) and not recipe.options.bias_correction


@dataclass(frozen=True)
class LayerGraphs:
    recipe: QDQ  # quantizes every candidate layer (no ``only``)
    prepared: onnx.ModelProto  # the FP32 graph as the recipe prepares it
    ranges: dict[str, float]
    rounded: dict[str, onnx.TensorProto]  # the whole recipe's quantized initializers after its correction
    shared: frozenset[str]  # layers whose stored weight another quantized layer reads
    batches: list[Batch]  # the calibration batches, to round those alone
    rescaling: Rescaling | None = None  # how ``prepared`` rescaled its activations, to round those alone alike
    kept_in: str | None = None  # a wider format each layer is kept in alone (nothing quantized), not quantized alone

    @classmethod
    def made(cls, recipe: QDQ, preparation: Prepared, ranges: dict[str, float], batches: list[Batch],
             kept_in: str | None = None) -> "LayerGraphs":
        whole, prepared = recipe.with_options(only=None), preparation.graph
        plan = [node for node, _ in whole.quantized_inputs(prepared) if node.op_type in QDQ_OPS]
        readers = Counter(node.input[1] for node in plan)
        shared = frozenset(node.name for node in plan if readers[node.input[1]] > 1)
        rounded: dict[str, onnx.TensorProto] = {}
        if whole.options.gptq:
            corrected = whole.correct(whole.apply(prepared, ranges), prepared, batches, preparation.rescaling)
            kept = {init.name for init in prepared.graph.initializer}  # float: the same in either graph
            rounded = {init.name: init for init in corrected.graph.initializer if init.name not in kept}
        rescaling = preparation.rescaling if rounded and shared else None  # the graph before: sent to workers
        return cls(whole, prepared, ranges, rounded, shared, batches, rescaling, kept_in)

    def graph(self, layer: str) -> bytes:
        """The serialized graph of the recipe with ``only=(layer,)``."""
        return serialized(self.model(layer))

    def model(self, layer: str) -> onnx.ModelProto:
        """The graph of the recipe with ``only=(layer,)``, or, :attr:`kept_in` a format, with ``layer`` alone kept in
        it and nothing quantized (``only=()``, the layer its fallback)."""
        alone = self.recipe.with_options(only=(layer,)) if self.kept_in is None else self.recipe.with_options(
            only=(), fallback_layers=(layer,), fallback_format=(self.kept_in,))
        made = onnx.ModelProto()
        made.CopyFrom(self.prepared)
        made = alone.apply_impl(made, self.ranges)
        if self.kept_in is not None:
            return made
        if layer in self.shared:
            made = alone.correct(made, self.prepared, self.batches, self.rescaling)
        elif self.rounded:
            for init in made.graph.initializer:
                if init.name in self.rounded:
                    init.CopyFrom(self.rounded[init.name])
        return made
