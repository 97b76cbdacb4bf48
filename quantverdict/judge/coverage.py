"""Whether a case's precision describes what ran: the coverage rule every verdict passes through first.

A case named INT8 passes only where the layers that ran in INT8 are all that its recipe promised: every
weighted layer quantized, except those kept in float by name, for a reason (:mod:`quantverdict.precision.coverage`).
- A float layer with no reason is *missed* (a weight the recipe did not see, a kind it does not know): the case
  fails, with the count and the kinds, whatever its outputs say.
- Where float layers hold most of the weights for want of a kernel (recurrent layers, a backend that quantizes
  ``nn.Linear`` only), a verdict named INT8 would describe float work: the case is skipped, saying so. Where they
  do because of a graph someone made so (a user's own graph, another quantizer's placement), it fails.
Layers kept in float deliberately (a pattern the user excluded, accuracy-aware fallback) are the recipe's own
measured choice: the share is taken over the rest.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from quantverdict.precision.coverage import DELIBERATE

MOSTLY = 0.5  # a verdict describes the precision where at least this share of the weights it could quantize ran in it


def _examples(names: list[str], count: int = 3) -> str:
    shown = ", ".join(repr(name) for name in names[:count])
    return shown + (f" and {len(names) - count} more" if len(names) > count else "")


def _weights(coverage: dict[str, Any]) -> str:
    parameters = coverage.get("parameters") or {}
    if not parameters.get("all"):
        return ""
    return f" ({100 * parameters['quantized'] / parameters['all']:.3g}% of their weights)"


def coverage_verdict(coverage: dict[str, Any], precision: str, model: str, who: str
                     ) -> tuple[Literal["failed", "skipped"], str] | None:
    """Why ``coverage`` (of ``who``: the recipe's graph, or a backend that chooses its layers) cannot carry a
    verdict named ``precision`` — ``("failed", message)`` or ``("skipped", message)`` — or None where it can."""
    name = precision.upper()
    layers, quantized = coverage["layers"], coverage["quantized"]
    missed: dict[str, str] = coverage.get("missed") or {}
    kept: dict[str, str] = coverage.get("kept") or {}
    if missed:  # each "Kind" or "Kind: what the graph shows"
        kinds = Counter(text.partition(":")[0] for text in missed.values())
        hints = sorted({text.partition(": ")[2] for text in missed.values() if ": " in text})
        return "failed", (f"{name} ran on {quantized} of {layers} weighted layers of {model!r}: "
                          f"{', '.join(f'{count} {kind}' for kind, count in kinds.most_common())} in float that {who} "
                          "did not keep in float by name "
                          f"({'; '.join(hints) or 'not quantized'}): {_examples(sorted(missed))}")
    share = quantized_share(coverage)
    if share is None or share >= MOSTLY:
        return None
    undeliberate = {layer: text for layer, text in kept.items() if text.partition(":")[0] not in DELIBERATE}
    why = "; ".join(text for text, _ in Counter(undeliberate.values()).most_common(2))
    float_kinds = coverage.get("float_kinds") or {}
    left = ", ".join(f"{count} {kind}" for kind, count in float_kinds.items()) or f"{layers - quantized} layers"
    status: Literal["failed", "skipped"] = "skipped" if all(
        text.partition(":")[0] == "no kernel" for text in undeliberate.values()) else "failed"
    return status, (f"{who} runs {quantized} of {layers} weighted layers of {model!r} in {name}{_weights(coverage)}; "
                    f"{left} in float ({why}): a verdict named {name} would describe float layers")


def quantized_share(coverage: dict[str, Any]) -> float | None:
    """The smaller of the shares of layers and of weights that ran in the precision, each over all but those kept
    in float deliberately (a CNN whose ``Linear`` holds most weights but whose convolutions do the work is no more
    INT8 than its layers are; three LSTMs and a ``Linear`` no more than their weights); None where there is nothing
    to share."""
    kept = coverage.get("kept") or {}
    deliberate = sum(1 for text in kept.values() if text.partition(":")[0] in DELIBERATE)
    shares = []
    if coverage["layers"] - deliberate > 0:
        shares.append(coverage["quantized"] / (coverage["layers"] - deliberate))
    parameters = coverage.get("parameters") or {}
    total = parameters.get("all", 0) - parameters.get("deliberately_float", 0)
    if total > 0:
        shares.append(parameters["quantized"] / total)
    return min(shares) if shares else None
