"""Which tensor's overflow breaks a low-precision output, among all that overflow.

Every input-dependent float tensor of the FP32 graph whose values exceed the largest finite value of the format
tensors are stored in unscaled (FP16: 65,504) is listed, in topological order, with its peak. Not every one
matters: an attention mask's "minus infinity" (mask × float32's lowest) becomes −∞ in FP16, and the Softmax it
feeds turns that into the same 0 that FP32 computes. So each is judged by its consequence: the FP32 graph is run
with that tensor alone stored in the format; where the outputs then leave FP32's (non-finite, or under the
case's cosine bound) it *breaks the output*, and the first such tensor is the one to name, with the fix a user
can make (keep its layer in FP32, or rescale it). A tensor that reaches a Softmax only through mask arithmetic
is labelled as a mask. Constants count too: one beyond the range is clipped to it where the graph is stored in the
format (a BatchNormalization's variance is folded first, as TensorRT folds it: :mod:`quantverdict.export.batchnorm`),
and judged the same way, with that constant alone clipped.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable, Collection, Sequence, TypedDict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantverdict.judge.compare import cosine
from quantverdict.judge.diagnose import input_dependent
from quantverdict.models.spec import Batch
from quantverdict.precision.exposing import exposed, from_node, read
from quantverdict.precision.graph import float_tensors

# what carries a mask to the scores it is added to (broadcast, reshaped, selected, combined)
MASK_PATH = frozenset({"Add", "Sub", "Mul", "Where", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Transpose",
                       "Concat", "Min", "Max"})


def _feeds_softmax(graph: onnx.GraphProto, tensor: str) -> bool:
    """Whether ``tensor`` reaches a Softmax through mask arithmetic only (:data:`MASK_PATH`)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    frontier, seen = [tensor], {tensor}
    while frontier:
        current = frontier.pop()
        for node in readers.get(current, []):
            if node.op_type in ("Softmax", "LogSoftmax"):
                return True
            if node.op_type in MASK_PATH:
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        frontier.append(out)
    return False


def _stored(model: onnx.ModelProto, activations: Collection[str], constants: Collection[str], storage: int,
            limit: float) -> onnx.ModelProto:
    """``model`` with ``activations`` rounded through ``storage`` (Cast there and back) for their readers and the
    initializers ``constants`` clipped to ±``limit``, as the format's graph stores them; everything else FP32."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for tensor in activations:
        low, back = f"{tensor}__stored", f"{tensor}__restored"
        for node in out.graph.node:
            for index, name in enumerate(node.input):
                if name == tensor:
                    node.input[index] = back
        position = next((i for i, node in enumerate(out.graph.node) if tensor in node.output), -1) + 1
        out.graph.node.insert(position, helper.make_node("Cast", [tensor], [low], to=storage))
        out.graph.node.insert(position + 1, helper.make_node("Cast", [low], [back], to=onnx.TensorProto.FLOAT))
        for value in out.graph.output:  # an output itself: its stored value is what the user gets
            if value.name == tensor:
                value.name = back
    for init in out.graph.initializer:
        if init.name in constants:
            init.CopyFrom(numpy_helper.from_array(np.clip(numpy_helper.to_array(init), -limit, limit), init.name))
    return out


def _hot_constants(model: onnx.ModelProto, limit: float) -> dict[str, tuple[float, onnx.NodeProto]]:
    """Float initializers with a value beyond ``limit``: each one's peak and the first node that reads it."""
    peaks = {init.name: float(np.abs(numpy_helper.to_array(init)).max(initial=0.0))
             for init in model.graph.initializer if init.data_type == onnx.TensorProto.FLOAT}
    readers = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, node)
    return {name: (peak, readers[name]) for name, peak in peaks.items() if peak > limit and name in readers}


def _outcome(changed: onnx.ModelProto, batch: Batch, outputs: list[str], reference: dict[str, np.ndarray],
             min_cosine: float) -> tuple[bool, float]:
    """(whether ``changed``, the FP32 graph with one tensor stored in the format, breaks an output, the worst output
    cosine then)."""
    names = [value.name for value in changed.graph.output]
    got = read(changed, names, batch)
    worst = 1.0
    for original, name in zip(outputs, names):
        candidate, expected = got[name].astype(np.float64), reference[original].astype(np.float64)
        if not np.all(np.isfinite(candidate[np.isfinite(expected)])):
            return True, float("nan")
        worst = min(worst, cosine(expected.ravel(), candidate.ravel()))
    return not worst >= min_cosine, worst


class OverflowEntry(TypedDict):
    """A tensor above the format's range, as the record stores it."""

    tensor: str
    node: str
    op: str
    value: float
    limit: float
    constant: bool
    mask: bool
    breaks_output: bool
    output_cosine: float | None


class Cure(TypedDict):
    tensors: list[str]
    output_cosine: float | None


class Overflow(OverflowEntry):
    """The tensor to name (its entry), every tensor above the range (``all``) and the set whose keeping cures."""

    all: list[OverflowEntry]
    cure: Cure | None


def overflows(fp32_path: Path, batches: list[Batch], limit: float, storage: int, min_cosine: float
              ) -> Overflow | None:
    """The overflow to name (the first tensor above ``limit`` whose storage in the format alone breaks an output,
    else the first above it), with every tensor above ``limit`` under ``all``: activations (infinite in the format)
    and constants (clipped to ``limit``), in graph order, each with its node (a constant's first reader), op, peak,
    whether it is a mask before a Softmax, and whether it breaks the output; None where nothing overflows."""
    model = onnx.load(str(fp32_path))
    graph = model.graph
    floats, live = float_tensors(model), input_dependent(graph)
    order = [(out, node) for node in graph.node for out in node.output if out in floats and out in live]
    names = [name for name, _ in order]
    peaks = dict.fromkeys(names, 0.0)
    for _, found in exposed(model, names, batches):  # in parts that fit the memory: every activation at once may not
        for name, values in found.items():
            finite = np.abs(values[np.isfinite(values)])
            peaks[name] = max(peaks[name], float(finite.max()) if finite.size else 0.0)
    constants = _hot_constants(model, limit)
    position = {id(node): index for index, node in enumerate(graph.node)}
    hot = sorted([*((name, node, False) for name, node in order if peaks[name] > limit),
                  *((name, node, True) for name, (_, node) in constants.items())],
                 key=lambda item: position[id(item[1])] + 0.5 * item[2])  # a node's infinite output before its constant
    if not hot:
        return None
    # what comes before the first tensor stored is FP32's in every trial: each is a pass over the rest of the graph
    rest, fed = from_node(model, position[id(hot[0][1])], batches[0])
    if not rest.graph.output:  # no output is made past it: one made before is FP32's, whatever is stored
        rest, fed = from_node(model, 0, batches[0])
    outputs = [value.name for value in rest.graph.output]
    reference = read(rest, outputs, fed)

    def stored(tensors: Sequence[tuple[str, bool]]) -> tuple[bool, float]:
        """Whether storing ``tensors`` (name, is a constant) in the format breaks an output, and the worst cosine."""
        activations = [name for name, constant in tensors if not constant]
        changed = _stored(rest, activations, [name for name, constant in tensors if constant], storage, limit)
        return _outcome(changed, fed, outputs, reference, min_cosine)

    found: list[OverflowEntry] = []
    for name, node, constant in hot:
        breaks, worst = stored([(name, constant)])
        found.append({"tensor": name, "node": node.name or name, "op": node.op_type,
                      "value": constants[name][0] if constant else peaks[name], "limit": limit, "constant": constant,
                      "mask": not constant and _feeds_softmax(graph, name), "breaks_output": breaks,
                      "output_cosine": None if np.isnan(worst) else worst})
    keys = [(entry["tensor"], entry["constant"]) for entry in found]
    cure = _cure(keys, [key for key, entry in zip(keys, found) if entry["breaks_output"]], stored)
    kept = [entry for key, entry in zip(keys, found) if cure is not None and key in cure[0]]
    head = next(iter(kept), next((entry for entry in found if entry["breaks_output"]), found[0]))
    return {**head, "all": found, "cure": None if cure is None else {
        "tensors": [entry["tensor"] for entry in kept], "output_cosine": cure[1]}}


Stored = Callable[[Sequence[tuple[str, bool]]], tuple[bool, float]]  # tensors stored → (breaks the output, cosine)


def _cure(hot: list[tuple[str, bool]], breakers: list[tuple[str, bool]], stored: Stored
          ) -> tuple[list[tuple[str, bool]], float | None] | None:
    """The tensors to keep in FP32 so that storing every other of the ``hot`` ones in the format leaves the output
    whole, and the worst output cosine then; None where storing them all does not break it. It starts from those that
    break the output alone (every one where they do not suffice) and drops, in graph order, each whose storing the
    output survives: no tensor left in it can be stored alone (a T5 encoder's RMSNorm x² breaks the output alone,
    yet keeping it cures nothing while its residual stream overflows too)."""
    if not stored(hot)[0]:
        return None
    keep = list(breakers)
    outcome = stored([t for t in hot if t not in keep]) if keep else (True, float("nan"))
    if outcome[0]:  # those that break it alone do not suffice: start from every one
        keep, outcome = list(hot), (False, 1.0)  # nothing stored: the FP32 graph
    for tensor in list(keep):
        trial = [kept for kept in keep if kept != tensor]
        result = stored([t for t in hot if t not in trial])
        if not result[0]:
            keep, outcome = trial, result
    return keep, (None if np.isnan(outcome[1]) else outcome[1])


SHOWN = 5  # other tensors above the range listed one per line; more are counted in one line


def overflow_message(case_id: str, name: str, overflow: Overflow) -> str:
    """The tensors whose keeping in FP32 cures the output (one line where one does), then the others above the
    format's range, one per line where few, else counted in a line, with what each is and the fix a user can make."""
    def where(entry: OverflowEntry) -> str:
        if entry.get("constant"):
            return (f"the constant {entry['tensor']!r} (read by {entry['node']}, {entry['op']}) holds "
                    f"{entry['value']:,.6g}")
        return f"{entry['tensor']!r} (output of {entry['node']}, {entry['op']}) reaches {entry['value']:,.6g} in FP32"

    def what(entry: OverflowEntry) -> str:
        return "a constant" if entry.get("constant") else \
            "a mask's minus infinity before a Softmax" if entry["mask"] else "an activation"

    limit, cure = f"{name}'s largest finite value {overflow['limit']:,.6g}", overflow.get("cure")
    by_tensor = {entry["tensor"]: entry for entry in overflow["all"]}
    kept = [by_tensor[tensor] for tensor in cure["tensors"]] if cure else []
    if len(kept) > 1:
        cosine = "" if cure["output_cosine"] is None else f": output cosine {cure['output_cosine']:.6g}"
        nodes: dict[str, list[OverflowEntry]] = {}
        for entry in kept:  # a constant is kept with the node that reads it
            nodes.setdefault(entry["node"], []).append(entry)
        lines = [f"{case_id}: overflow: {len(overflow['all'])} tensors exceed {limit}; keeping {len(nodes)} "
                 f"node{'s' if len(nodes) > 1 else ''} in FP32 cures the output (checked with every other tensor above "
                 f"it stored in {name}{cosine}), or rescaling what they hold:"]
        lines += [f"  keep {node} ({held[0]['op']}) in FP32: " + "; ".join(
            f"its constant {e['tensor']!r} holds {e['value']:,.6g}" if e.get("constant") else
            f"its output {e['tensor']!r} reaches {e['value']:,.6g}" for e in held) for node, held in nodes.items()]
    else:
        constant = bool(overflow.get("constant"))
        if overflow["breaks_output"] and constant:
            effect = f" and the output breaks; rescale it, or keep {overflow['node']} (its reader) in FP32"
        elif overflow["breaks_output"]:
            effect = f" and the output breaks; keep {overflow['node']} in FP32 or rescale it"
        elif kept:
            effect = f"; keeping it in FP32 cures the output: keep {overflow['node']} in FP32 or rescale it"
        else:
            effect = "; no overflowing tensor alone breaks the output"
        lines = [f"{case_id}: overflow: {where(overflow)}, above {limit}: stored in {name} it is "
                 f"{'clipped to it' if constant else 'infinite'}{effect}"]
        kept = [by_tensor[overflow["tensor"]]]
    others = [entry for entry in overflow["all"] if entry not in kept]
    if len(others) <= SHOWN:
        for entry in others:
            effect = "breaks the output" if entry["breaks_output"] else "the output holds"
            lines.append(f"  also above it: {where(entry)} ({what(entry)}; stored in {name} alone, {effect})")
    elif others:
        kinds = ", ".join(f"{count} {kind}" for kind, count in Counter(what(entry) for entry in others).items())
        breaking = sum(entry["breaks_output"] for entry in others)
        needless = ", yet keeping them is not needed once those above are kept" if cure else ""
        lines.append(f"  also above it: {len(others)} others ({kinds}); stored in {name} alone, {breaking} break the "
                     f"output{needless} (each: metrics.overflow.all)")
    return "\n".join(lines)
