"""Every YAML file the harness reads, read one way: bounded, safe, validated against a schema.

A document is read with PyYAML's safe loader (no tags that run code), refused beyond a size, a
nesting depth and a number of nodes counted with aliases expanded (a 1 KB "billion laughs" file
expands to millions), then validated by a pydantic schema owned by the module that uses it. Each
problem becomes one line naming the file, the model (manifest entries), the field's path as
``models[0].inputs[0].rnage`` and, for a misspelled name, the closest allowed one.

The harness's own defaults (tolerances, gate and history policies, defect catalogue, speedup
floors) are package data, read through :mod:`importlib.resources`, so an installed wheel finds
them wherever it lives; a user's file replaces or merges over them (each loader says which).
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

import yaml

from quantverdict.errors import HarnessError

T = TypeVar("T")

MAX_BYTES = 1 << 20  # a manifest of a thousand models is ~200 KB
MAX_NODES = 200_000  # values after alias expansion
MAX_DEPTH = 32
EXPANSION = 16  # expanded characters per character of the file (YAML anchors reused a few times pass)


class DocumentError(HarnessError):
    """A YAML document that cannot be read or does not fit its schema; one line per problem."""


def packaged(name: str) -> resources.abc.Traversable:
    """A default file shipped inside the package (``quantverdict/defaults/<name>``)."""
    return resources.files("quantverdict").joinpath("defaults", name)


def read_yaml(source: Path | resources.abc.Traversable, what: str, max_bytes: int = MAX_BYTES) -> Any:
    """The parsed document, refused with one line if missing, too large, malformed or too deeply or
    widely nested (aliases counted as expanded)."""
    try:
        if isinstance(source, Path) and source.exists() and not source.resolve().is_file():
            raise DocumentError(f"cannot read {what} {source}: not a regular file (a folder, a device or a pipe: "
                                "/dev/zero never ends, a FIFO blocks)")
        size = source.stat().st_size if isinstance(source, Path) else None
        if size is not None and size > max_bytes:
            raise DocumentError(f"{what} {source} is {size:,} bytes; the limit is {max_bytes:,}")
        with source.open("rb") as handle:  # at most one byte past the limit, whatever the size said
            data = handle.read(max_bytes + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DocumentError(f"cannot read {what} {source}: {exc}") from exc
    if len(data) > max_bytes:
        raise DocumentError(f"{what} {source} is over the {max_bytes:,}-byte limit")
    try:
        document = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 (a SafeLoader that also refuses repeated keys)
    except yaml.YAMLError as exc:
        raise DocumentError(f"{what} {source} is not valid YAML: {' '.join(str(exc).split())}") from exc
    except RecursionError:
        raise DocumentError(f"{what} {source} nests deeper than {MAX_DEPTH} levels: refused") from None
    _check_size(document, len(text), f"{what} {source}")
    return document


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key repeated in one mapping (the last would win silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the constructor names it
                continue
            if repeated:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep)


def _check_size(document: Any, size: int, where: str) -> None:
    """Walk the document as it would be serialised (aliases expanded), stopping at the first limit: more
    than :data:`MAX_NODES` values, more than :data:`EXPANSION` times the file's own characters (what the
    harness echoes into run records stays of the order of what the user wrote), or :data:`MAX_DEPTH` levels."""
    nodes, characters, stack = MAX_NODES, EXPANSION * size + 4096, [(document, 0)]
    while stack:
        node, depth = stack.pop()
        nodes -= 1
        characters -= len(node) if isinstance(node, str) else 1
        if nodes < 0 or characters < 0:
            limit = f"{MAX_NODES:,} values" if nodes < 0 else f"{EXPANSION} times its own size"
            raise DocumentError(f"{where} expands to more than {limit} (aliases counted as expanded): refused")
        if depth > MAX_DEPTH:
            raise DocumentError(f"{where} nests deeper than {MAX_DEPTH} levels: refused")
        if isinstance(node, dict):
            stack.extend((item, depth + 1) for pair in node.items() for item in pair)
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)


def validate(document: Any, schema: type[T], where: str, describe: "Describe | None" = None) -> T:
    """``document`` as ``schema`` (a pydantic model or dataclass), or a :class:`DocumentError` whose
    lines each name ``where``, the entry (``describe``) and the field's path."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(schema).validate_python(document)
    except ValidationError as exc:
        raise DocumentError("\n".join(error_lines(exc.errors(), schema, document, where, describe))) from None


Describe = typing.Callable[[Any, tuple[Any, ...]], str]
"""(document, error path) → words naming the entry the path is in (``model 'tiny-cnn'``), or ''."""


def load(source: Path | None, default: str, schema: type[T], what: str, describe: Describe | None = None) -> T:
    """A user's file (``source``) or the packaged default, read and validated."""
    path = source if source is not None else packaged(default)
    return validate(read_yaml(path, what), schema, str(path), describe)


def layers(source: Path | None, default: str, schema: type[T], what: str) -> list[T]:
    """The packaged default, then the user's file where given: the order to merge them in."""
    documents = [load(None, default, schema, what)]
    if source is not None:
        documents.append(load(source, default, schema, what))
    return documents


def error_lines(errors: Iterable[Mapping[str, Any]], schema: Any, document: Any, where: str,
                describe: Describe | None = None) -> list[str]:
    lines = []
    for error in errors:
        loc = tuple(part for part in error["loc"] if part != "[key]")
        entry = describe(document, loc) if describe else ""
        prefix = ": ".join(filter(None, [where, entry, dotted(loc) or "(top level)"]))
        lines.append(f"{prefix}: {explain(error, schema, loc)}")
    return lines


def dotted(loc: Iterable[Any]) -> str:
    """``('models', 0, 'inputs', 1, 'range')`` as ``models[0].inputs[1].range``; a name that is empty or holds
    characters that do not print (a line break splits the one-line message) as ``['\\x85']``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (isinstance(part, str) and part.isprintable() and part):
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else part
    return out


def explain(error: Mapping[str, Any], schema: Any, loc: tuple[Any, ...]) -> str:
    """The error in words, with the closest allowed name where a name was misspelled."""
    kind, given = error["type"], loc[-1] if loc else None
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        allowed = field_names(schema, loc[:-1])
        return f"unknown field{suggest(str(given), allowed)}"
    if kind == "literal_error":
        allowed = [name.strip("'") for name in error["ctx"]["expected"].replace(" or ", ", ").split(", ")]
        value = error.get("input")
        if isinstance(value, str) and value in allowed:  # version: "1" where the schema wants the number 1
            return f"{value!r} is a string: write it unquoted, {value}"
        return f"{value!r} is not one of {', '.join(allowed)}{closest(str(value), allowed)}"
    if kind in ("missing", "missing_argument"):
        return "required field missing"
    message = str(error["msg"])
    return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def suggest(name: str, allowed: list[str]) -> str:
    """`` 'nmae'; did you mean 'name'? (allowed: …)``: to follow "unknown field" and the like."""
    return f" {name!r}{closest(name, allowed)}" + (f" (allowed: {', '.join(allowed)})" if allowed else "")


def closest(name: str, allowed: list[str]) -> str:
    """``; did you mean 'name'?`` for the closest allowed name, or nothing."""
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def field_names(schema: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model or dataclass found at ``loc`` inside ``schema`` ([] if unknown)."""
    node = _type_at(schema, loc)
    if node is None:
        return []
    if hasattr(node, "model_fields"):
        return [field.alias or name for name, field in node.model_fields.items()]
    if dataclasses.is_dataclass(node):
        return [field.name for field in dataclasses.fields(node)]
    return []


def _type_at(schema: Any, loc: tuple[Any, ...]) -> Any:
    node = schema
    for part in loc:
        node = _unwrap(node)
        origin, args = typing.get_origin(node), typing.get_args(node)
        if origin in (list, tuple, typing.Sequence, Iterable) or (origin is not None and isinstance(part, int)
                                                                   and args):
            node = args[0] if args else None
        elif origin in (dict, Mapping, typing.Mapping) or (origin is not None and len(args) == 2):
            node = args[1]
        elif hasattr(node, "model_fields"):
            field = next((f for n, f in node.model_fields.items() if (f.alias or n) == part), None)
            node = field.annotation if field else None
        elif dataclasses.is_dataclass(node):
            hints = typing.get_type_hints(node)
            node = hints.get(str(part))
        else:
            return None
        if node is None:
            return None
    return _unwrap(node)


def _unwrap(node: Any) -> Any:
    """``X | None`` → ``X``; ``Annotated[X, …]`` → ``X``."""
    if typing.get_origin(node) is typing.Annotated:
        node = typing.get_args(node)[0]
    args = [a for a in typing.get_args(node) if a is not type(None)]
    if typing.get_origin(node) in (typing.Union, getattr(__import__("types"), "UnionType", ())) and len(args) == 1:
        return _unwrap(args[0])
    return node
