"""Stage 2's loaders, lazy and cached (a loader costs nothing until called): a model's FP32 graph, and
that graph at the opset a recipe needs.

- :class:`Fp32Graph`: the user's ONNX file (checked, and lowered to an IR version every runtime reads),
  or the torch module exported, keyed by the spec's build key where it has one (a warm run never builds
  the module) and by the module's weights otherwise.
- :class:`AtOpset`: a graph converted up to an opset by onnx's version converter, or itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from quantverdict.cache import Cache
from quantverdict.capabilities import package_version
from quantverdict.export.compat import at_opset, lowest_ir, opset_of, serialized
from quantverdict.export.torchscript import export_built, export_onnx, load_onnx
from quantverdict.hashing import content_hash, file_sha256, source_fingerprint
from quantverdict.models.spec import ModelSpec


@dataclass(frozen=True)
class Fp32Graph:
    spec: ModelSpec
    module: Callable[[], Any]  # builds the torch module (called only where the export is not cached)
    cache: Cache

    def __call__(self) -> Path:
        spec = self.spec
        if spec.onnx_path is not None:
            return readable(spec.onnx_path, self.cache)
        build_key = spec.build_key()
        if build_key is None:  # keyed by the built module's weights
            return export_onnx(spec, self.module(), self.cache)
        return export_built(spec, "build:" + build_key, self.module, self.cache)


def readable(path: Path, cache: Cache) -> Path:
    """A user's ONNX file, checked (a missing or corrupt one is named), or a cached copy of it at the lowest IR
    version that holds it where its own is higher (:mod:`quantverdict.export.compat`)."""
    graph = load_onnx(path)
    if graph.ir_version <= lowest_ir(graph):
        return path
    key = content_hash("readable", file_sha256(path), source_fingerprint("quantverdict.export"))
    return cache.get_or_create("readable", key, ".onnx", lambda: serialized(graph), {"file": str(path)})


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

        model = onnx.load(str(path))
        if opset_of(model) >= self.opset:
            return path
        key = content_hash("opset", file_sha256(path), self.opset, package_version("onnx"),
                           source_fingerprint("quantverdict.export"))
        return self.cache.get_or_create("opset", key, ".onnx",
                                        lambda: serialized(at_opset(model, self.opset, self.why, self.where)),
                                        {"graph": path.name, "opset": self.opset})
