"""torch → ONNX (FP32) with named I/O, dynamic axes and a chosen opset; checked and cached.

Also the one place that reads ONNX files from users, so every corrupt or missing file is
reported the same way.
"""
from __future__ import annotations

import io
import warnings
from pathlib import Path
from types import CodeType
from typing import TYPE_CHECKING, Callable

import onnx

from quantverdict.cache import Cache
from quantverdict.hashing import content_hash, source_fingerprint
from quantverdict.errors import InputSpecError, ModelFileError, user_trace
from quantverdict.export.compat import serialized
from quantverdict.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

DEFAULT_OPSET = 19  # float8 Q/DQ needs 19; TensorRT 10/11 and ONNX Runtime ≥ 1.15 parse it


def load_onnx(path: Path, external_data: bool = True) -> onnx.ModelProto:
    """Read and check an ONNX file, with its external data read from beside it (``external_data=False``: without
    it, and checked only where it has none); the error names the file and what is wrong with it."""
    from onnx.external_data_helper import uses_external_data

    if not path.is_file():
        raise ModelFileError(f"ONNX file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=external_data)
        if external_data or not any(uses_external_data(init) for init in model.graph.initializer):
            onnx.checker.check_model(model)
    except Exception as exc:  # protobuf DecodeError, ValidationError, …
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelFileError(f"corrupt or invalid ONNX file {path}: {first_line}") from exc
    return model


def torch_model_hash(module: "object") -> str:
    """Hash of the architecture (its repr) and every parameter and buffer."""
    state = module.state_dict()  # type: ignore[attr-defined]
    return content_hash(repr(module), {k: v.detach().cpu().numpy() for k, v in state.items()})


def export_onnx(spec: ModelSpec, module: "object", cache: Cache, opset: int | None = None) -> Path:
    """The cached FP32 ONNX export of ``module``, keyed by its weights; the torch model is checked
    against its spec first."""
    return export_built(spec, "weights:" + torch_model_hash(module), lambda: module, cache, opset)


def export_built(spec: ModelSpec, identity: str, module: Callable[[], "object"], cache: Cache,
                 opset: int | None = None) -> Path:
    """The cached FP32 ONNX export of the module ``identity`` names (its weights' hash, or a spec's
    build key): ``module`` is called only on a cache miss, so a warm run never builds it."""
    from quantverdict.capabilities import package_version

    opset = opset or DEFAULT_OPSET
    torch_version = package_version("torch")
    key = content_hash("onnx-export", identity, [repr(i) for i in spec.inputs], list(spec.outputs), opset,
                       torch_version, source_fingerprint("quantverdict.export"))

    def produce() -> bytes:
        import torch

        built = module()
        sample = spec.sample_batches(1, seed=0)[0]
        args = tuple(torch.from_numpy(sample[i.name]) for i in spec.inputs)
        buffer = io.BytesIO()

        def export() -> None:
            with warnings.catch_warnings(), torch.autograd.graph.saved_tensors_hooks(_dropped, _dropped):
                warnings.simplefilter("ignore")  # TorchScript exporter deprecation notices
                torch.onnx.export(
                    built, args, buffer, input_names=[i.name for i in spec.inputs],
                    output_names=list(spec.outputs), opset_version=opset, dynamo=False,
                    dynamic_axes={i.name: dict(i.dynamic_axes) for i in spec.inputs},
                )

        if isinstance(built, torch.nn.Module) and not isinstance(built, torch.jit.ScriptModule):
            _checked_while_traced(spec, built, export)
        else:
            _check_inputs(spec, built, args)
            export()
        model = onnx.load_from_string(buffer.getvalue())
        onnx.checker.check_model(model, full_check=True)
        return serialized(model)

    return cache.get_or_create("onnx", key, ".onnx", produce,
                               {"model": spec.name, "opset": opset, "torch": torch_version, "identity": identity})


def _dropped(value: object) -> None:
    """What autograd keeps of a tensor it would save for a backward pass while the export traces: nothing. The trace
    runs with gradients on, as it must (under ``no_grad`` PyTorch's attention takes a fused path no exporter knows,
    ``aten::_native_multi_head_attention``), so every activation would stay held until it ends: a ResNet-50 at batch 96
    peaked at 9.3 GB in 22 s, with nothing kept 1.9 GB in 13 s, the same graph to the byte (at a deployment batch of
    256, the 36 GB a torch nightly's export peaked at). No backward pass ever runs on it."""
    return None


def _checked_while_traced(spec: ModelSpec, module: "torch.nn.Module", export: Callable[[], None]) -> None:
    """``export()``, which traces ``module``'s forward once, with that forward checked against the spec as
    :func:`_check_inputs` checks a forward of its own: a failure while the forward runs is the model refusing its
    declared inputs, and it returns as many outputs as the spec names. One forward at the declared batch, not two: the
    check's was 45% of a ResNet-50's export at batch 64 (6.9 of 15.2 s), and the graph is the same to the byte (hooks
    add no node)."""
    running = False  # inside the traced forward: an exception there is the model refusing its inputs

    def before(_module: object, _inputs: object) -> None:
        nonlocal running
        running = True

    def after(_module: object, _inputs: object, outputs: object) -> None:
        nonlocal running
        running = False
        _check_outputs(spec, outputs)

    hooks = [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        export()
    except InputSpecError:
        raise
    except Exception as exc:
        if running:
            raise _refused(spec, exc, getattr(type(module).forward, "__code__", None)) from exc
        raise
    finally:
        for hook in hooks:
            hook.remove()


def _check_inputs(spec: ModelSpec, module: "object", args: tuple) -> None:
    """A forward of ``module`` (a scripted one: no hooks to check the traced forward with) on the declared inputs."""
    import torch

    try:
        with torch.no_grad():
            outputs = module(*args)  # type: ignore[operator]
    except Exception as exc:
        raise _refused(spec, exc) from exc
    _check_outputs(spec, outputs)


def _refused(spec: ModelSpec, exc: Exception, forward: CodeType | None = None) -> InputSpecError:
    """One line naming the model and its inputs; the traceback from the user's ``forward`` where it was traced."""
    shapes = ", ".join(f"{i.name}{tuple(i.shape)}" for i in spec.inputs)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    error = InputSpecError(f"model {spec.name!r} rejects its declared inputs {shapes}: {message}")
    error.trace = user_trace(exc, forward)  # the user's forward: where in it the inputs were refused
    return error


def _check_outputs(spec: ModelSpec, outputs: object) -> None:
    count = len(outputs) if isinstance(outputs, (tuple, list)) else 1
    if count != len(spec.outputs):
        raise InputSpecError(f"model {spec.name!r} returns {count} outputs but its spec names "
                             f"{len(spec.outputs)}: {list(spec.outputs)}")
