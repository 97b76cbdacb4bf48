"""Stage 2's loaders, lazy and cached (a loader costs nothing until called): a model's FP32 graph, and
that graph at the opset a recipe needs.

- :class:`Fp32Graph`: the user's ONNX file (checked, and lowered to an IR version every runtime reads),
  or the torch module exported, keyed by the spec's build key where it has one (a warm run never builds
  the module) and by the module's weights otherwise; either normalised (:class:`Normalised`).
- :class:`Normalised`: a graph with its constant subgraphs folded into initializers, its fixed scalar inputs read
  as constants (:mod:`quantverdict.export.normalise`): weights where a recipe looks for them, whoever exported it.
- :class:`AtOpset`: a graph converted up to an opset by onnx's version converter, or itself.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from quantverdict.cache import Cache
from quantverdict.capabilities import package_version
from quantverdict.export.compat import at_opset, lowest_ir, opset_of, serialized
from quantverdict.export.normalise import fixed_inputs, foldable, normalised
from quantverdict.export.torchscript import export_built, export_onnx, load_onnx
from quantverdict.errors import InputSpecError
from quantverdict.hashing import content_hash, file_sha256, source_fingerprint
from quantverdict.models.spec import ModelSpec


@dataclass(frozen=True)
class Fp32Graph:
    spec: ModelSpec
    module: Callable[[], Any]  # builds the torch module (called only where the export is not cached)
    cache: Cache

    def __call__(self) -> Path:
        fixed = {item.name: (item.value, item.dtype) for item in self.spec.inputs if item.value is not None}
        return Normalised(self.exported, self.cache, fixed)()

    def exported(self) -> Path:
        spec = self.spec
        if spec.onnx_path is not None:
            path = readable(spec.onnx_path, self.cache)
            _check_names(spec, path)
            return path
        build_key = spec.build_key()
        if build_key is None:  # keyed by the built module's weights
            return export_onnx(spec, self.module(), self.cache)
        return export_built(spec, "build:" + build_key, self.module, self.cache)


def _check_names(spec: ModelSpec, path: Path) -> None:
    """The inputs and outputs a spec names for an ONNX file are the graph's own, or one line lists those it has."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    for role, declared, found in (("inputs", [i.name for i in spec.inputs],
                                   [v.name for v in graph.input if v.name not in initializers]),
                                  ("outputs", list(spec.outputs), [v.name for v in graph.output])):
        missing = [name for name in declared if name not in found]
        if missing:
            raise InputSpecError(f"model {spec.name!r}: {role} {missing} are not {role} of {spec.onnx_path}; "
                                 f"its {role}: {found}")


def readable(path: Path, cache: Cache) -> Path:
    """A user's ONNX file, checked (a missing or corrupt one is named), or a cached copy of it in one file (its
    external data inside, so that its key covers its weights) at the lowest IR version that holds it, where its
    weights lie in other files or its IR version is higher (:mod:`quantverdict.export.compat`)."""
    from onnx.external_data_helper import uses_external_data

    graph = load_onnx(path, external_data=False)  # parsed once where its weights are inside it
    data = sorted({entry.value for init in graph.graph.initializer if uses_external_data(init)
                   for entry in init.external_data if entry.key == "location"})
    if not data and graph.ir_version <= lowest_ir(graph):
        return path
    key = content_hash("readable", file_sha256(path), [file_sha256(path.parent / name) for name in data
                                                       if (path.parent / name).is_file()],
                       source_fingerprint("quantverdict.export"))
    return cache.get_or_create("readable", key, ".onnx", lambda: serialized(load_onnx(path) if data else graph),
                               {"file": str(path)})


@dataclass(frozen=True)
class Normalised:
    """``graph`` with its constant subgraphs folded into initializers, cached by the graph's bytes, the folding
    code and what evaluates the constants (ONNX Runtime, onnx-graphsurgeon); a graph with nothing to fold (most
    torch exports) is itself, so its bytes stay as exported."""

    graph: Callable[[], Path]
    cache: Cache
    fixed: Mapping[str, tuple[float, str]] = field(default_factory=dict)  # inputs the manifest fixes: value, dtype

    def __call__(self) -> Path:
        import onnx

        path = self.graph()
        key = content_hash("normalised", file_sha256(path), package_version("onnx_graphsurgeon"),
                           package_version("onnxruntime"), source_fingerprint("quantverdict.export"),
                           sorted(self.fixed.items()))

        def changes() -> bool:
            model = onnx.load(str(path))
            return foldable(model, fixed_inputs(model, self.fixed))

        def made() -> bytes:
            model = onnx.load(str(path))
            return serialized(normalised(model, fixed_inputs(model, self.fixed)))

        if not self.cache.json("foldable", [key], changes, {"graph": path.name}):
            return path
        return self.cache.get_or_create("normalised", key, ".onnx", made, {"graph": path.name})


@dataclass(frozen=True)
class AtOpset:
    """``graph`` at default-domain opset ``opset`` or later (``why`` needs it; ``where`` names the graph in
    an error): itself where it is already there."""

    graph: Callable[[], Path]
    opset: int
    why: str
    where: str
    cache: Cache

    def __call__(self) -> Path:
        path = self.graph()
        if not self.opset:
            return path
        import onnx

        stat = path.stat()
        if file_opset(str(path.resolve()), stat.st_size, stat.st_mtime_ns) >= self.opset:
            return path
        model = onnx.load(str(path))
        key = content_hash("opset", file_sha256(path), self.opset, package_version("onnx"),
                           source_fingerprint("quantverdict.export"))
        return self.cache.get_or_create("opset", key, ".onnx",
                                        lambda: serialized(at_opset(model, self.opset, self.why, self.where)),
                                        {"graph": path.name, "opset": self.opset})


@functools.lru_cache(maxsize=256)
def file_opset(path: str, size: int, mtime_ns: int) -> int:
    """The default-domain opset of the graph at ``path``, read once per process while its size and mtime stay the
    same: a search asks for every candidate's source graph, and parsing a transformer's weights each time cost MiniLM's
    search 17 s."""
    import onnx

    return opset_of(onnx.load(path, load_external_data=False))

