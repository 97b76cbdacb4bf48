"""What a graph runs in its quantized precision, layer by layer, and why each float layer is float.

Every weighted operator is counted, by kind: convolutions, matrix products (``Gemm``, ``MatMul``, ``Einsum``),
recurrent layers (``LSTM``, ``GRU``, ``RNN``), attention, and the integer operators. A product of activations alone
(attention's scores and its weighted sum: a ``MatMul`` or ``Einsum`` with no constant operand) holds no weights and
is not a layer here: counted, it made a graph whose every weight is INT8 read as 56 of 72 layers. A layer runs quantized
where every one of its data inputs is dequantized (a ``DequantizeLinear`` behind it, through shape-only ops)
or where it is an integer operator. A float layer is *kept* where the recipe says why (a pattern the user
excluded, accuracy-aware fallback, a format with no kernel for it, the graph a user supplied) and *missed*
otherwise: a layer the recipe should have quantized and did not, which a verdict must not pass.

Parameters are counted too (the constant operands' sizes), so that a verdict can say how much of a network's
weights ran in the precision, not only how many layers: three LSTMs and one ``Linear`` are one layer in four,
and a sliver of the weights.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import onnx

if TYPE_CHECKING:
    from quantverdict.precision.base import Recipe

# op type → the positions of its data inputs (activations and weights; not biases or sequence lengths)
LAYER_INPUTS: dict[str, tuple[int, ...]] = {
    "Conv": (0, 1), "ConvTranspose": (0, 1), "Gemm": (0, 1), "MatMul": (0, 1), "LSTM": (0, 1, 2),
    "GRU": (0, 1, 2), "RNN": (0, 1, 2), "Attention": (0, 1, 2)}
EINSUM = "Einsum"  # every input is a data input
RECURRENT = ("LSTM", "GRU", "RNN")
# integer operators: quantized by construction; the position of the weight operand
INTEGER_WEIGHT = {"MatMulInteger": 1, "ConvInteger": 1, "QLinearMatMul": 3, "QLinearConv": 3,
                  "MatMulIntegerToFloat": 1, "DynamicQuantizeMatMul": 1, "QGemm": 3, "QAttention": 1,
                  "DynamicQuantizeLSTM": 1}
INTEGER_LAYERS = tuple(INTEGER_WEIGHT)
# products that are layers only where an operand is a constant (else activations alone: attention's scores)
PRODUCTS = frozenset({"MatMul", EINSUM, "MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat"})
# a float layer's reason starts with its kind (Recipe.float_reasons): "excluded" (a pattern of the user's), "fallback",
# "no kernel" (no runtime has one for it in the precision), "placement" (another quantizer's), "supplied" (a user's graph)
DELIBERATE = ("excluded", "fallback")  # chosen for accuracy: the rest of the network is what the verdict describes
# ops that move or reshape a tensor without changing its values: a DequantizeLinear behind them still feeds
PASS_THROUGH = frozenset({"Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze", "Flatten"})


@dataclass(frozen=True)
class Layer:
    """One weighted operator: its node name, kind, weight parameters, and whether it runs quantized."""

    name: str
    kind: str
    parameters: int
    quantized: bool
    why: str = ""  # for a float layer: what the graph shows (a weight-only quantization, a weight computed at run time)
    stored: int | None = None  # the quantized ONNX type its first dequantized input is stored in


class _Graph:
    def __init__(self, graph: onnx.GraphProto, outer: "_Graph | None" = None):
        self.sizes = dict(outer.sizes) if outer else {}  # a body reads its outer graph's constants too
        self.sizes.update({init.name: int(np.prod(init.dims)) for init in graph.initializer})
        self.types = dict(outer.types) if outer else {}
        self.types.update({init.name: init.data_type for init in graph.initializer})
        self.producer = {out: node for node in graph.node for out in node.output}
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
                self.sizes[node.output[0]] = int(np.prod(node.attribute[0].t.dims))

    def source(self, name: str) -> tuple[str, onnx.NodeProto | None]:
        """The tensor behind ``name`` once shape-only ops are walked back, and its producer."""
        node = self.producer.get(name)
        while node is not None and node.op_type in PASS_THROUGH and node.input:
            name = node.input[0]
            node = self.producer.get(name)
        return name, node

    def dequantized(self, name: str) -> bool:
        node = self.source(name)[1]
        return node is not None and node.op_type == "DequantizeLinear"

    def stored(self, name: str) -> int | None:
        """The quantized ONNX type a DequantizeLinear behind ``name`` reads (its constant's, else its zero point's)."""
        node = self.source(name)[1]
        if node is None or node.op_type != "DequantizeLinear":
            return None
        return self.types.get(self.source(node.input[0])[0],
                              self.types.get(node.input[2]) if len(node.input) > 2 else None)

    def parameters(self, name: str) -> int:
        """Elements of the constant behind ``name`` (through DequantizeLinear and shape-only ops); 0 for an activation."""
        name, node = self.source(name)
        if node is not None and node.op_type == "DequantizeLinear":
            name = self.source(node.input[0])[0]
        return self.sizes.get(name, 0)


def _kind(node: onnx.NodeProto) -> str | None:
    if node.op_type in INTEGER_WEIGHT or node.op_type == EINSUM:
        return node.op_type
    if node.op_type in LAYER_INPUTS and len(node.input) > 1:
        return node.op_type
    return None


def layers(model: onnx.ModelProto, rewritten: set[str] | frozenset[str] = frozenset()) -> Iterator[Layer]:
    """Every weighted operator of ``model``'s graph, and those inside the bodies of its control flow (``Loop``,
    ``Scan``, ``If``: named ``outer/inner``, which no recipe here enters); those named in
    ``rewritten`` are quantized by a recipe that rounds weights in place
    (:meth:`~quantverdict.precision.base.Recipe.rewritten_layers`)."""
    yield from _layers(model.graph, _Graph(model.graph), rewritten, "", "")


def _layers(body: onnx.GraphProto, graph: _Graph, rewritten: set[str] | frozenset[str], prefix: str,
            inside: str) -> Iterator[Layer]:
    for node in body.node:
        for attribute in node.attribute:
            bodies = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            for sub in bodies:
                yield from _layers(sub, _Graph(sub, graph), rewritten, f"{prefix}{node.name}/",
                                   f"inside {'an' if node.op_type[0] in 'AEIOU' else 'a'} {node.op_type} body, "
                                   "which the recipe does not enter")
    for node in body.node:
        kind = _kind(node)
        if kind is None:
            continue
        name = prefix + node.name
        if kind in INTEGER_WEIGHT:
            parameters = graph.parameters(node.input[INTEGER_WEIGHT[kind]])
            if parameters or kind not in PRODUCTS:
                yield Layer(name, kind, parameters, True)
            continue
        positions = range(len(node.input)) if kind == EINSUM else (0, 1) if node.domain == "com.microsoft" \
            else LAYER_INPUTS[kind]  # contrib Attention: input, weights (then a bias)
        data = [node.input[i] for i in positions if i < len(node.input) and node.input[i]]
        parameters = sum(graph.parameters(item) for item in data)
        if kind in PRODUCTS and not parameters:
            continue
        quantized = [graph.dequantized(item) for item in data]
        why = ""
        if not all(quantized):
            weights = [graph.parameters(item) > 0 for item in data]
            if inside:
                why = inside
            elif any(q and w for q, w in zip(quantized, weights)):
                why = "weights quantized, activations float (weight-only)"
            elif kind in ("Conv", "ConvTranspose", "Gemm") and not weights[1]:
                why = "its weight is computed at run time, not a constant"
        if name in rewritten:
            quantized, why = [True], ""
        stored = next((t for t in map(graph.stored, data) if t is not None), None)
        yield Layer(name, kind, parameters, all(quantized), why, stored)


Reason = Callable[[Layer], "str | None"]
"""For a float layer: why the recipe keeps it in float ("no kernel: …", "excluded: …"), or None if it does not say."""


def layer_coverage(model: onnx.ModelProto, kept: Reason, rewritten: set[str] | frozenset[str] = frozenset(),
                   stored: int | None = None) -> dict[str, object]:
    """How many weighted layers run quantized and which, by name and by kind, their weights (quantized, all, and
    those kept in float deliberately), and each float layer's reason (``kept``) or, where the recipe gives none,
    its place among the ``missed``. With ``stored`` (an ONNX type), a layer whose weight is stored in another
    quantized type is not quantized in the precision (an INT8 recipe's fallback layer in FP8) and needs a reason too."""
    found = [replace(layer, quantized=False) if stored is not None and layer.quantized and layer.stored is not None
             and layer.stored != stored else layer for layer in layers(model, rewritten)]
    quantized = [layer for layer in found if layer.quantized]
    floating = [layer for layer in found if not layer.quantized]
    reasons = {layer.name: kept(layer) for layer in floating}
    deliberate = sum(layer.parameters for layer in floating
                     if (reasons[layer.name] or "").partition(":")[0] in DELIBERATE)
    kinds: dict[str, list[int]] = {}
    for layer in found:
        counts = kinds.setdefault(layer.kind, [0, 0])
        counts[0] += layer.quantized
        counts[1] += 1
    return {"layers": len(found), "quantized": len(quantized),
            "quantized_layers": sorted(layer.name for layer in quantized),
            "float_layers": sorted(layer.name for layer in floating),
            "kinds": dict(sorted(kinds.items())),
            "parameters": {"quantized": sum(layer.parameters for layer in quantized),
                           "all": sum(layer.parameters for layer in found), "deliberately_float": deliberate},
            "kept": {name: reason for name, reason in sorted(reasons.items()) if reason},
            "missed": {layer.name: f"{layer.kind}{': ' + layer.why if layer.why else ''}"
                       for layer in sorted(floating, key=lambda item: item.name) if not reasons[layer.name]},
            "float_kinds": dict(Counter(layer.kind for layer in floating).most_common())}


def recipe_coverage(graph: onnx.ModelProto, recipe: "Recipe", source: onnx.ModelProto | None) -> dict[str, object]:
    """:func:`layer_coverage` of ``recipe``'s ``graph``, with the reasons the recipe gives on its FP32 ``source``;
    ``source`` None: a graph the user supplied, whose float layers are theirs to keep."""
    if source is None:
        return layer_coverage(graph, lambda layer: "supplied: left in float in the graph you supplied")
    reasons = recipe.float_reasons(source)
    return layer_coverage(graph, lambda layer: reasons.get(layer.name), recipe.rewritten_layers(source),
                          recipe.quantized_type)


def planned_coverage(source: onnx.ModelProto, recipe: "Recipe") -> dict[str, object] | None:
    """:func:`layer_coverage` of the graph ``recipe`` would make of its FP32 ``source``, from its placement alone
    (:meth:`~quantverdict.precision.base.Recipe.planned_layers`), before any calibration: the layers its fallback has
    yet to choose count as quantized, so no choice of them quantizes a larger share. None where only making the graph
    tells."""
    planned = recipe.planned_layers(source)
    if planned is None:
        return None
    reasons = recipe.float_reasons(source)
    return layer_coverage(source, lambda layer: reasons.get(layer.name), planned | recipe.rewritten_layers(source))


def left_by(source: onnx.ModelProto, who: str) -> dict[str, str]:
    """Every weighted layer of ``source`` as one ``who`` (another quantizer) may leave in float by its own placement."""
    return {layer.name: f"placement: left in float by {who}" for layer in layers(source)}


def quantized_layers(model: onnx.ModelProto) -> dict[str, object]:
    """:func:`layer_coverage` with no reasons given: every float layer listed as missed."""
    return layer_coverage(model, lambda layer: None)
