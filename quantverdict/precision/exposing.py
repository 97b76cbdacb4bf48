"""A graph's inner tensors read under ONNX Runtime as written, in parts that fit the memory.

Calibration, channel ranges, GPTQ's H, a failed case's first divergence and its overflow peaks each make tensors of
the FP32 graph outputs. All of a network's at once are all its activations: a ResNet-101 at 64 × 3 × 224² holds
about 10 GB of them, and ONNX Runtime's copies double it (a cold nightly's worker: 23 GB on a 2 × H200 host). So the
tensors asked for are split, in the order asked, into parts whose values (their sizes by shape inference at the
batch's shapes) fit :func:`exposure_budget`, and each part is read from the graph cut to the nodes it needs: where one
part holds them all (every small network), one session and one pass per batch, as before.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import onnx

from quantverdict.export.compat import serialized
from quantverdict.models.spec import Batch
from quantverdict.precision.graph import reads
from quantverdict.resources import available_memory

if TYPE_CHECKING:
    import onnxruntime

BUDGET_SHARE = 8  # a part's values take at most this share of the memory available (ONNX Runtime's copies: twice)
SHAPE_VALUES = 64  # initializers of at most this many values go to shape inference with their values (shapes, axes)


# ONNX Runtime's threads busy-wait for their next kernel (its default), burning the CPU between a session's runs and
# after them, which the harness's own CPU work (histograms, GPTQ) and its workers then share: off for sessions whose
# runs are not timed (a graph's semantics, its calibration values), as fast on a 2-core EPYC (MobileNetV2 at batch 8,
# 99-139 ms a run either way) for 10-20% less CPU, and none left spinning when the run returns.
NO_SPINNING = {"session.intra_op.allow_spinning": "0"}


def as_written_options() -> "onnxruntime.SessionOptions":
    """ONNX Runtime session options for a graph's own semantics: graph optimisations off (every tensor exists as named,
    Q/DQ pairs run as written), errors only in the log (its notes on the harness's own graphs, unused initializers, are
    noise), and no thread left spinning (:data:`NO_SPINNING`: its runs are not timed)."""
    import onnxruntime

    options = _untimed_options()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def quantizers_as_written_options() -> "onnxruntime.SessionOptions":
    """ONNX Runtime session options for a graph's semantics up to its float kernels' last bits: every graph
    optimisation on but those of Q/DQ (``session.disable_quant_qdq``: no quantizer fused into an integer kernel, each
    rounds and saturates as written, and so do casts), so float nodes run fused and in the CPU's blocked layouts
    (MobileNetV2 on one thread 2.1× as fast; its outputs 104 dB from the graph's as written). For ranking layers,
    which each quantized alone is evaluated for; recipes are judged as written."""
    options = _untimed_options()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    return options


def _untimed_options() -> "onnxruntime.SessionOptions":
    """Errors only in the log, no thread left spinning (:data:`NO_SPINNING`): sessions whose runs are not timed."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    for key, value in NO_SPINNING.items():
        options.add_session_config_entry(key, value)
    return options


def as_written_session(model: onnx.ModelProto, pooled: bool = True) -> Any:
    """An ONNX Runtime CPU session over ``model`` with graph optimisations off: every tensor exists as
    named and Q/DQ pairs run as written. Not ``pooled``: its buffers are the values' own, not its arena's (a value
    held holds the whole arena: a part read after another would hold both), for runs slower by their allocations."""
    import onnxruntime

    options = as_written_options()
    options.enable_cpu_mem_arena = options.enable_mem_pattern = pooled
    return onnxruntime.InferenceSession(serialized(model), options, providers=["CPUExecutionProvider"])


def exposure_budget() -> int | None:
    """The bytes of tensor values one part may hold: a :data:`BUDGET_SHARE` of the memory available now (None where
    the OS does not say: one part)."""
    free = available_memory()
    return None if free is None else free // BUDGET_SHARE


def exposed(model: onnx.ModelProto, names: Sequence[str], batches: Sequence[Batch],
            budget: int | None = None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """``names``' values over ``batches``: (the batch's index, a part's values), part after part, each part over
    every batch in order, so each tensor meets the batches in their order. ``budget``: the bytes a part may hold
    (default :func:`exposure_budget`); a tensor larger than it is a part alone. The values are the caller's until it
    asks for the next: then they are dropped (keep what is needed, not the dict).

    Where two batches' values fit the budget as one part (every small network), the next batch runs while the caller
    works on this one's (ONNX Runtime's run holds no interpreter lock, and a small network's kernels leave a core of
    two idle): a calibration's binning and GPTQ's sums no longer wait for each pass, nor a pass for them."""
    budget, names = exposure_budget() if budget is None else budget, list(dict.fromkeys(names))
    sizes = value_bytes(model, batches[0] if batches else {}) if budget is not None and names else {}  # inferred once
    ahead = _cut(names, sizes, None if budget is None else budget // 2)
    split = ahead if len(ahead) == 1 else _cut(names, sizes, budget)
    for part in split:
        session = as_written_session(cut_to(model, part), pooled=len(split) == 1)
        runs = _runs(session, part, batches, read_ahead=len(ahead) == 1)  # one session a part: its start copies
        for index in range(len(batches)):  # no name, nor enumerate's tuple, holds a batch's outputs past its turn
            values = dict(zip(part, next(runs)))
            yield index, values
            values.clear()  # the caller's loop still holds this dict while the next values are read
        del runs, session  # its buffers, before the next part's session makes its own


def _runs(session: "onnxruntime.InferenceSession", names: list[str], batches: Sequence[Batch],
          read_ahead: bool) -> Iterator[list[np.ndarray]]:
    """``session``'s outputs ``names`` over each of ``batches`` in turn, the next batch's run on a thread of its own
    while the caller holds this one's where ``read_ahead``."""
    if not read_ahead or len(batches) < 2:
        yield from (session.run(names, dict(batch)) for batch in batches)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="quantverdict-read-ahead") as pool:  # ends with its run, if left
        pending = pool.submit(session.run, names, dict(batches[0]))
        for index in range(len(batches)):
            outputs = pending.result()  # a run's error, raised here
            if index + 1 < len(batches):
                pending = pool.submit(session.run, names, dict(batches[index + 1]))
            yield outputs
            del outputs


def read(model: onnx.ModelProto, names: Sequence[str], batch: Batch) -> dict[str, np.ndarray]:
    """``names``' values over one ``batch``, from ``model`` cut to what they need (one part: see :func:`parts`), by a
    session without an arena: one run gains nothing from it, and values kept would keep it."""
    return dict(zip(names, as_written_session(cut_to(model, names), pooled=False).run(list(names), dict(batch))))


def parts(model: onnx.ModelProto, names: Sequence[str], batch: Batch, budget: int | None) -> list[list[str]]:
    """``names`` in their order, cut where a part's values at ``batch``'s shapes would pass ``budget`` bytes (a value
    whose size shape inference does not know is counted as the largest known)."""
    names = list(dict.fromkeys(names))
    return _cut(names, value_bytes(model, batch) if budget is not None and names else {}, budget)


def _cut(names: list[str], sizes: dict[str, int], budget: int | None) -> list[list[str]]:
    """:func:`parts` of ``names``, given each value's bytes (``sizes``, from :func:`value_bytes`)."""
    if budget is None or not names:
        return [names] if names else []
    largest = max(sizes.values(), default=0)
    out: list[list[str]] = [[]]
    held = 0
    for name in names:
        size = sizes.get(name, largest)
        if out[-1] and held + size > budget:
            out.append([])
            held = 0
        out[-1].append(name)
        held += size
    return out


def value_bytes(model: onnx.ModelProto, batch: Batch) -> dict[str, int]:
    """The bytes of each value whose shape inference finds at ``batch``'s input shapes (none where it fails). Large
    initializers are given to it as typed inputs of their shape (their values are not what sizes depend on, and a
    copy of them is a copy of the model's weights)."""
    shaped = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
    shaped.graph.CopyFrom(onnx.GraphProto(node=model.graph.node, input=model.graph.input, output=model.graph.output,
                                          value_info=model.graph.value_info))
    typed = {value.name for value in model.graph.input}  # an older exporter lists initializers as inputs too
    for init in model.graph.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= SHAPE_VALUES:
            shaped.graph.initializer.append(init)
        elif init.name not in typed:
            shaped.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, init.dims))
    for value in shaped.graph.input:
        if value.name in batch:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            dims.extend(onnx.TensorShapeProto.Dimension(dim_value=size) for size in np.shape(batch[value.name]))
    try:
        inferred = onnx.shape_inference.infer_shapes(shaped).graph
    except (onnx.shape_inference.InferenceError, ValueError):
        return {}
    out = {}
    for value in [*inferred.input, *inferred.value_info, *inferred.output]:
        kind = value.type.tensor_type
        dims = [dim.dim_value if dim.HasField("dim_value") else None for dim in kind.shape.dim]
        if kind.HasField("shape") and None not in dims and kind.elem_type:
            itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type)).itemsize
            out[value.name] = int(np.prod(dims, dtype=np.int64)) * itemsize
    return out


def cut_to(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """``model`` with ``names`` as its outputs and only the nodes they need (ONNX Runtime runs every node of a
    graph, whichever outputs are fetched)."""
    needed, kept = set(names), []
    for node in reversed(model.graph.node):
        if needed.intersection(node.output):
            kept.append(node)
            needed.update(reads(node))
    out = with_outputs(model, names)
    del out.graph.node[:]
    out.graph.node.extend(reversed(kept))
    return out


def with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose outputs are its tensors ``names`` (no types: ONNX Runtime infers them)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    return out


def from_node(model: onnx.ModelProto, start: int, batch: Batch) -> tuple[onnx.ModelProto, Batch]:
    """The graph from its node ``start`` on, its inputs the tensors those nodes read from before it (the graph's own
    inputs among them), and their values over ``batch``: its nodes compute what they compute in the whole graph, for
    a pass over the rest alone. Its outputs are the graph's that those nodes make."""
    nodes = list(model.graph.node[start:])
    made = {name for node in nodes for name in node.output}
    constant = {init.name for init in model.graph.initializer}
    fed = [name for name in dict.fromkeys(name for node in nodes for name in sorted(reads(node)))
           if name not in made and name not in constant]
    declared = {value.name: value for value in model.graph.input}
    computed = [name for name in fed if name not in declared]
    values = {**{name: batch[name] for name in fed if name in declared}, **(read(model, computed, batch) if computed
                                                                           else {})}
    rest = onnx.ModelProto()
    rest.CopyFrom(model)
    del rest.graph.node[:], rest.graph.input[:]
    rest.graph.node.extend(nodes)
    rest.graph.input.extend(declared[name] if name in declared else onnx.helper.make_tensor_value_info(
        name, onnx.helper.np_dtype_to_tensor_dtype(values[name].dtype), None) for name in fed)
    kept = [value for value in rest.graph.output if value.name in made]
    del rest.graph.output[:]
    rest.graph.output.extend(kept)
    return rest, values
